"""Work queued on commit never fails the change that committed: a broker that
refuses the connection is logged, and the periodic sweep queues the work again."""

import logging
import socket

import pytest
from celery import Celery

from apps.core.dispatch import queue_on_commit


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
