"""Redis, the broker, dies (SIGKILL) and comes back empty: the work in flight and the
work accepted meanwhile is done within a minute of its return, by the same worker.

The production shape on a Redis of the test's own: a web node (granian serving
project.asgi), `celery -A project worker` with two pool processes (what it starts on
a two-core host) and `celery -A project beat`, all on the test database. The worker's
renders are held until the test lets them go (tests/e2e/slow_render_worker.py), so
Redis dies while the worker holds a task and waits on the broker for the next one,
every time. Redis keeps nothing on disk: the queued and unacknowledged messages die
with it. What brings the work back is the database: a claimed render finishes in the
worker that holds it, beat's sweeps queue again what the lost messages asked for
(docs/operations.md, "When Redis dies")."""

import os
import sys
import time
from types import SimpleNamespace

import pytest
import redis

from apps.audit.models import AuditEvent
from apps.rollouts.models import Rollout
from apps.snapshots.models import Publication, Snapshot
from apps.tenancy.models import Role
from apps.webhooks.models import WebhookDelivery
from apps.webhooks.services import endpoint_create
from tests import factories
from tests.deployfiles import unit_command
from tests.e2e.harness import (
    CeleryProcess,
    Server,
    free_port,
    http_json,
    shared_database_url,
    wait_for,
)
from tests.webhooks import receiver as receivers
from tests.world import build_second

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SECRET_KEY = "fault-broker-crash-" + "0123456789abcdefghijklmnopqrstuvwxyz" * 2
# From Redis' return to the work done: the goal.
RECOVERY_S = 60.0
# Longer than the worker's reconnection backoff grows to in that time (2, 4, 6 ... s).
LONG_OUTAGE_S = 20.0


@pytest.fixture
def receiver(settings):
    """(Receiver, url): a webhook receiver on 127.0.0.1, allowed as an endpoint here and
    by the worker (BELLWETHER_WEBHOOK_ALLOW_PRIVATE)."""
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": True}
    live = receivers.Receiver()
    server, url = receivers.start(live)
    yield live, url
    server.shutdown()
    server.server_close()


@pytest.fixture
def rollout_at_its_canary(environment, first, superuser):
    """shop/prod: #1 active on two agents, #2 staged over them by a rollout whose
    canary (web-1) has #2 pinned; an automatic gate lets the rest go once it reports."""
    second = build_second(environment, superuser, staged=True)
    agents = factories.enrolled_agents(environment, 2, actor=superuser)
    rollout = factories.start_rollout(environment, second, agents[:1], actor=superuser,
                                      canary_gate="auto",
                                      waves=[{"percent": 100, "gate": "auto"}])
    return SimpleNamespace(rollout=rollout, snapshot=second, canary=agents[0])


@pytest.fixture
def shape(private_redis, processes, environment, tenant, superuser, receiver,
          rollout_at_its_canary, tmp_path):
    """The node, the worker (renders held by `gate`) and beat on the private Redis;
    an operator's API token; a webhook endpoint for the rollout's events."""
    live, url = receiver
    endpoint, live.secret = endpoint_create(
        environment=environment, url=url, actor=superuser,
        events=["rollout.wave_advanced", "rollout.completed", "snapshot.published"])
    gate = tmp_path / "renders-may-finish"
    environ = {key: value for key, value in os.environ.items()
               if key not in ("CELERY_TASK_ALWAYS_EAGER", "DATABASE_POOL")}
    environ.update({
        "DJANGO_SETTINGS_MODULE": "project.settings", "DATABASE_URL": shared_database_url(),
        "REDIS_URL": private_redis.url, "SECRET_KEY": SECRET_KEY, "DEBUG": "0",
        "SECURE_COOKIES": "0", "ALLOWED_HOSTS": "127.0.0.1,localhost", "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1", "BELLWETHER_WEBHOOK_ALLOW_PRIVATE": "1",
        "BELLWETHER_TEST_RENDER_GATE": str(gate),
        # An agent's report prompts its rollout's reconcile as a countdown this long,
        # which the worker holds meanwhile; beat's sweep (15 s) comes first.
        "BELLWETHER_RECONCILE_COALESCE_S": "20"})
    node = Server.production(port=free_port(), env=environ, log_path=tmp_path / "node.log")
    # The unit's worker with two pool processes, through celery's own main with the
    # renders held (tests.e2e.slow_render_worker).
    unit = unit_command("bellwether-worker.service", BELLWETHER_WORKER_CONCURRENCY="2")
    worker = CeleryProcess("celery worker",
                           [sys.executable, "-m", "tests.e2e.slow_render_worker", *unit[1:]],
                           env=environ, log_path=tmp_path / "worker.log",
                           ready_marker=" ready.")
    beat = CeleryProcess.beat(env=environ, log_path=tmp_path / "beat.log",
                              state_root=tmp_path / "state")
    for process in (node, worker, beat):
        processes.append(process)
        process.start()
    operator = factories.member(tenant, Role.OWNER, username="ops", actor=superuser)
    _, token = factories.api_token(operator)
    for process in (node, worker, beat):
        process.wait_ready()
    return SimpleNamespace(redis=private_redis, node=node, worker=worker, beat=beat,
                           token=token, gate=gate, receiver=live, endpoint=endpoint,
                           worker_pid=worker.process.pid, **vars(rollout_at_its_canary))


def logs(shape) -> str:
    return "\n".join(p.dump() for p in (shape.node, shape.worker, shape.beat))


def publish(shape) -> str:
    """A publish through the node (202, whatever the broker does); the publication."""
    status, body = http_json("POST", shape.node.url + "/api/v1/environments/shop/prod/publish",
                             token=shape.token)
    assert status == 202, (status, body)
    return body["id"]


def canary_reports(shape) -> None:
    """The canary reports #2 applied, through the node (201, whatever the broker does)."""
    status, body = http_json("POST", shape.node.url + "/api/v1/agent/reports", {
        "deployment_id": None, "snapshot": shape.snapshot.number,
        "checksum": shape.snapshot.checksum, "status": "succeeded", "message": "applied"},
        token=shape.canary.token)
    assert status == 201, (status, body)


def waiting_on_the_broker(shape) -> bool:
    """Whether the worker is blocked in BRPOP for its next task."""
    try:
        clients = redis.Redis(port=shape.redis.port, socket_timeout=1).client_list()
    except redis.RedisError:
        return False
    return any(client.get("cmd") == "brpop" for client in clients)


def render_held(shape, publication_id: str) -> None:
    """Until the worker claimed the render (the claim commits before it renders) and
    waits on the broker for more work with its other pool process."""
    wait_for(lambda: (Publication.objects.filter(pk=publication_id, claimed_at__isnull=False)
                      .exists() and waiting_on_the_broker(shape), None),
             what="the worker rendering and waiting on the broker", timeout=30,
             diagnostics=lambda: logs(shape))


def redis_killed(shape) -> None:
    shape.redis.kill()
    assert shape.worker.running(), logs(shape)


def redis_back(shape) -> float:
    """Redis started again, empty, on its port; when."""
    shape.redis.start()
    return time.monotonic()


def done_after_return(shape, back: float, what: str, probe) -> float:
    """Wait for `probe` (-> bool) within RECOVERY_S of Redis' return, the worker alive
    throughout; the seconds it took."""

    def check():
        assert shape.worker.running(), f"the worker exited\n{logs(shape)}"
        return probe(), None

    wait_for(check, what=what, timeout=max(0.0, back + RECOVERY_S - time.monotonic()),
             interval=0.25, diagnostics=lambda: logs(shape))
    return time.monotonic() - back


def rendered(publication_id: str) -> bool:
    return Publication.objects.get(pk=publication_id).state == Publication.State.READY


def rollout_advanced(shape) -> bool:
    return Rollout.objects.get(pk=shape.rollout.pk).current_wave >= 1


def wave_advance_delivered(shape) -> bool:
    return any(r.event == "rollout.wave_advanced" and r.signature_ok
               for r in shape.receiver.received)


def recovered(shape, back: float, publication_ids: list[str]) -> dict[str, float]:
    """Each publication rendered, the rollout past its canary wave and that wave's
    webhook delivered, within RECOVERY_S of Redis' return, by the worker started with
    the test; then each done once. The seconds each took after the return."""
    took = {f"render {n}": done_after_return(shape, back, f"publication {pk} rendered",
                                             lambda pk=pk: rendered(pk))
            for n, pk in enumerate(publication_ids, 1)}
    took["rollout"] = done_after_return(shape, back, "the rollout's next wave",
                                        lambda: rollout_advanced(shape))
    took["webhook"] = done_after_return(shape, back, "the wave's webhook delivered",
                                        lambda: wave_advance_delivered(shape))
    for publication_id in publication_ids:
        assert Publication.objects.get(pk=publication_id).snapshot is not None
    # Same inputs as #2: each render matched it; none stored a second snapshot.
    assert Snapshot.objects.filter(environment=shape.snapshot.environment).count() == 2
    assert AuditEvent.objects.filter(action="rollout.advance",
                                     object_id=str(shape.rollout.pk)).count() == 1
    assert WebhookDelivery.objects.filter(endpoint=shape.endpoint,
                                          event="rollout.wave_advanced").count() == 1
    assert [r.event for r in shape.receiver.received].count("rollout.wave_advanced") == 1
    assert shape.worker.process.pid == shape.worker_pid and shape.beat.running()
    assert "Unrecoverable error" not in shape.worker.log(), logs(shape)
    print("after Redis' return:", {k: f"{v:.1f} s" for k, v in took.items()})
    return took


def test_work_held_when_redis_dies_is_done_within_a_minute_of_its_empty_return(shape):
    held = publish(shape)
    render_held(shape, held)

    redis_killed(shape)
    canary_reports(shape)  # recorded; its prompt to reconcile the rollout is lost
    back = redis_back(shape)
    shape.gate.touch()

    recovered(shape, back, [held])
    later = publish(shape)  # through the node and the worker, on the new Redis
    done_after_return(shape, back, "a publish after the return", lambda: rendered(later))


def test_redis_killed_twice_in_a_row_the_second_time_with_a_countdown_held(shape):
    held = publish(shape)
    render_held(shape, held)
    redis_killed(shape)
    redis_back(shape)
    # Reconnected, the worker takes the canary's prompt, a countdown of the coalescing
    # window (BELLWETHER_RECONCILE_COALESCE_S), and holds it unacknowledged.
    wait_for(lambda: (shape.worker.log().count("Connected to") == 2, None),
             what="the worker reconnected", diagnostics=lambda: logs(shape))
    canary_reports(shape)
    wait_for(lambda: ("rollouts.tasks.rollout_reconcile_task[" in shape.worker.log()
                      and waiting_on_the_broker(shape), None),
             what="the worker holding the rollout's prompt", diagnostics=lambda: logs(shape))

    redis_killed(shape)
    back = redis_back(shape)
    shape.gate.touch()
    recovered(shape, back, [held])


def test_redis_down_longer_than_the_reconnection_backoff_then_back_empty(shape):
    held = publish(shape)
    render_held(shape, held)
    redis_killed(shape)
    killed = time.monotonic()
    during = publish(shape)  # accepted; its render's prompt is lost
    canary_reports(shape)
    # The held render ends while Redis is down (well within its time limit, which the
    # worker does not enforce while it waits to reconnect).
    shape.gate.touch()
    wait_for(lambda: (rendered(held), None), what="the held render done during the outage",
             diagnostics=lambda: logs(shape))
    time.sleep(max(0.0, killed + LONG_OUTAGE_S - time.monotonic()))  # the outage itself
    back = redis_back(shape)

    recovered(shape, back, [held, during])
    # The lost prompt's render was queued again from the database, by beat's sweep.
    assert f"publication {during} still rendering; queueing it again" in shape.worker.log()
