"""Work queued on commit never fails the change that committed: a broker that
refuses the connection is logged, and the periodic sweep queues the work again."""

import logging
import socket
import time

import pytest
from celery import Celery
from django.core.cache import cache

from apps.core import dispatch
from apps.core.breaker import best_effort_redis
from apps.core.dispatch import COALESCE_MARGIN_S, queue_on_commit, wait_until_sent


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


@pytest.mark.slow
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


class RecordingTask:
    """A task whose sends are recorded (what the broker would get), not delivered."""

    name = "tests.recording"

    class app:  # noqa: N801 - shaped like a Celery app's conf
        class conf:  # noqa: N801
            task_always_eager = False

    def __init__(self):
        self.sent = []

    def delay(self, *args):
        self.sent.append((args, None))

    def apply_async(self, args, countdown=None):
        self.sent.append((tuple(args), countdown))


def _commit_prompts(callbacks_fixture, task, prompts, **options):
    for args in prompts:
        with callbacks_fixture(execute=True):
            queue_on_commit(task, *args, **options)
    wait_until_sent()


def test_coalesced_prompts_in_one_window_are_one_run_after_the_window(
        db, django_capture_on_commit_callbacks):
    cache.clear()
    task = RecordingTask()

    _commit_prompts(django_capture_on_commit_callbacks, task,
                    [(7,), (7,), (8,), (7,)], coalesce_s=5)

    # One run per argument list, started after the window closes (every commit seen).
    assert task.sent == [((7,), 5 + COALESCE_MARGIN_S), ((8,), 5 + COALESCE_MARGIN_S)]


@pytest.mark.slow
def test_a_prompt_after_the_window_is_a_new_run(db, django_capture_on_commit_callbacks):
    cache.clear()
    task = RecordingTask()

    _commit_prompts(django_capture_on_commit_callbacks, task, [(7,)], coalesce_s=1)
    time.sleep(1.2)  # the window (a cache entry with a 1 s timeout) has closed
    _commit_prompts(django_capture_on_commit_callbacks, task, [(7,)], coalesce_s=1)

    assert [args for args, _ in task.sent] == [(7,), (7,)]


def test_uncoalesced_prompts_are_each_sent(db, django_capture_on_commit_callbacks):
    task = RecordingTask()

    _commit_prompts(django_capture_on_commit_callbacks, task, [(7,), (7,)])

    assert task.sent == [((7,), None), ((7,), None)]


def test_without_the_cache_every_coalesced_prompt_is_sent(
        db, django_capture_on_commit_callbacks, monkeypatch):
    def refuse(*args, **kwargs):
        raise ConnectionError("cache down")

    # On the class: the sender thread has its own cache object.
    monkeypatch.setattr(type(dispatch.cache._connections[dispatch.cache._alias]), "add", refuse)
    task = RecordingTask()
    try:
        _commit_prompts(django_capture_on_commit_callbacks, task, [(7,), (7,)], coalesce_s=5)
    finally:
        best_effort_redis.reset()

    assert task.sent == [((7,), 5 + COALESCE_MARGIN_S)] * 2


def test_reports_prompt_their_rollout_coalesced(db, django_capture_on_commit_callbacks):
    from apps.rollouts.tasks import rollout_reconcile_task
    from tests import factories

    owner = factories.superuser()
    tenant = factories.tenant(actor=owner)
    env, first, second = factories.staged_environment(
        factories.application(tenant, actor=owner), "prod", owner)
    agents = factories.enrolled_agents(env, 3, actor=owner)
    rollout = factories.start_rollout(env, second, agents[:2], actor=owner)

    with django_capture_on_commit_callbacks() as callbacks:
        for agent in agents[:2]:
            factories.ack(agent, second)

    prompts = [(c.args, c.coalesce_s) for c in callbacks
               if getattr(c, "task", None) is rollout_reconcile_task]
    assert prompts == [((rollout.pk,), 1)] * 2  # one run after the window, for both
