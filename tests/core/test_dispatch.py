"""Work queued on commit never fails the change that committed: a broker that
refuses the connection is logged, and the periodic sweep queues the work again."""

import logging
import socket

import pytest
from celery import Celery

from apps.core.dispatch import queue_on_commit, wait_until_sent


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]  # nothing listens once the probe closes


@pytest.fixture
def unreachable_broker_task():
    app = Celery("unreachable", broker=f"redis://127.0.0.1:{_closed_port()}/0",
                 set_as_current=False)
    app.conf.broker_connection_timeout = 1

    @app.task(name="tests.noop")
    def noop(value):
        return value

    yield noop
    app.close()


def test_a_broker_that_is_down_costs_a_log_line_not_the_change(
        db, unreachable_broker_task, django_capture_on_commit_callbacks, caplog):
    with caplog.at_level(logging.WARNING, logger="apps.core.dispatch"), \
            django_capture_on_commit_callbacks(execute=True) as callbacks:
        queue_on_commit(unreachable_broker_task, "publication-1")
        # The commit hands the message to the sender thread and returns at once.
    wait_until_sent()

    assert len(callbacks) == 1
    [record] = caplog.records
    assert "could not queue tests.noop('publication-1',)" in record.getMessage()
    assert "periodic sweep" in record.getMessage()


def test_nothing_is_queued_when_the_transaction_rolls_back(db, unreachable_broker_task,
                                                           django_capture_on_commit_callbacks):
    from django.db import transaction

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        try:
            with transaction.atomic():
                queue_on_commit(unreachable_broker_task, "never")
                raise RuntimeError("the change failed")
        except RuntimeError:
            pass

    assert callbacks == []


def test_the_commit_does_not_wait_for_a_broker_that_does_not_answer(
        db, django_capture_on_commit_callbacks, caplog):
    """A stalled broker (it accepts the connection, never answers) holds the sender
    thread, not the request whose change committed."""
    import threading
    import time

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    app = Celery("stalled", broker=f"redis://127.0.0.1:{listener.getsockname()[1]}/0",
                 set_as_current=False)
    app.conf.broker_connection_timeout = 1
    app.conf.broker_transport_options = {"socket_timeout": 1, "socket_connect_timeout": 1}
    app.conf.task_publish_retry_policy = {"max_retries": 0}

    @app.task(name="tests.stalled")
    def stalled(value):
        return value

    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="apps.core.dispatch"), \
                django_capture_on_commit_callbacks(execute=True):
            queue_on_commit(stalled, "publication-2")
        assert time.monotonic() - started < 0.5
        assert any(t.name == "bellwether-dispatch" for t in threading.enumerate())
        wait_until_sent()
        assert "could not queue tests.stalled('publication-2',)" in caplog.text
    finally:
        listener.close()
        app.close()


def test_inline_tasks_still_run_in_the_request(db, django_capture_on_commit_callbacks):
    app = Celery("inline", set_as_current=False)
    app.conf.task_always_eager = True
    ran = []

    @app.task(name="tests.inline")
    def inline(value):
        ran.append(value)

    with django_capture_on_commit_callbacks(execute=True):
        queue_on_commit(inline, "now")

    assert ran == ["now"]
