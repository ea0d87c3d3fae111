"""Retention racing a snapshot becoming referenced, on PostgreSQL with real row locks.

Each test holds one side inside its transaction (after it decided, before it
commits) while the other side starts: the second must wait for the first and then
act on what it committed — a snapshot pinned or reported applied is never removed,
and a removed snapshot is never pinned. Also: the database refuses a delete of a
snapshot that retention did not name.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import IntegrityError, connection, transaction

from apps.core.errors import ApplicationError
from apps.fleet.models import Agent
from apps.releases import retention
from apps.releases import services as releases
from apps.snapshots.models import Snapshot
from tests import factories

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 60
HOLD_S = 1.0  # how long the first side sits in its transaction after deciding


@pytest.fixture
def world(environment, superuser):
    """shop/prod #1..#4 (#4 active, #3 the rollback target) bounded to 2 snapshots,
    and one agent: retention would remove #1 and #2."""
    snapshots = [factories.publish_variant(environment, superuser, workers=10 + i)
                 for i in range(4)]
    releases.environment_update(environment=environment, actor=superuser,
                                retention_snapshots=2)
    node = factories.enrolled_agents(environment, 1)[0]
    return environment, snapshots, node


def _both(first, second, entered: threading.Event):
    """Run `first` and, once it signals `entered`, `second`; each in its own thread
    and connection. Returns (result or exception, seconds) of each."""
    def timed(fn, wait: bool):
        try:
            if wait:
                assert entered.wait(TIMEOUT_S)
            started = time.monotonic()
            try:
                return fn(), time.monotonic() - started
            except (ApplicationError, IntegrityError) as error:
                return error, time.monotonic() - started
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=2) as pool:
        a = pool.submit(timed, first, False)
        b = pool.submit(timed, second, True)
        return a.result(TIMEOUT_S), b.result(TIMEOUT_S)


def _held(monkeypatch, module, name: str, entered: threading.Event) -> None:
    """Make module.name signal `entered` after it ran, then hold its transaction."""
    original = getattr(module, name)

    def holding(*args, **kwargs):
        result = original(*args, **kwargs)
        entered.set()
        time.sleep(HOLD_S)
        return result

    monkeypatch.setattr(module, name, holding)


def test_a_pin_waits_for_retention_and_never_names_a_removed_snapshot(world, superuser,
                                                                     monkeypatch):
    environment, s, node = world
    entered = threading.Event()
    _held(monkeypatch, retention, "snapshot_holds", entered)

    def pin():
        return releases.agent_pin(agent=node.agent, snapshot=s[1], actor=superuser,
                                  expected_generation=node.agent.generation)

    (went, _), (pinned, waited) = _both(
        lambda: retention.environment_retention_apply(environment_id=environment.pk), pin,
        entered)

    assert went == {"snapshots": 2, "rollouts": 0}
    assert waited >= HOLD_S * 0.8  # it waited for retention's locks
    assert isinstance(pinned, (ApplicationError, IntegrityError)), pinned
    assert not Snapshot.objects.filter(pk=s[1].pk).exists()
    assert Agent.objects.get(pk=node.pk).pinned_snapshot_id is None


def test_retention_waits_for_a_pin_and_keeps_what_it_pinned(world, superuser, monkeypatch):
    environment, s, node = world
    entered = threading.Event()
    _held(monkeypatch, releases.fleet, "agent_pin_hold", entered)

    def pin():
        return releases.agent_pin(agent=node.agent, snapshot=s[1], actor=superuser,
                                  expected_generation=node.agent.generation)

    (pinned, _), (went, waited) = _both(
        pin, lambda: retention.environment_retention_apply(environment_id=environment.pk),
        entered)

    assert isinstance(pinned, Agent) and pinned.pinned_snapshot_id == s[1].pk
    assert waited >= HOLD_S * 0.8
    assert went == {"snapshots": 1, "rollouts": 0}
    assert list(Snapshot.objects.filter(environment=environment).order_by("number")
                .values_list("number", flat=True)) == [2, 3, 4]


def test_retention_waits_for_a_report_and_keeps_what_the_agent_applied(world, monkeypatch):
    environment, s, node = world
    entered = threading.Event()
    _held(monkeypatch, releases, "reports_record", entered)

    (reported, _), (went, waited) = _both(
        lambda: factories.ack(node, s[1]),
        lambda: retention.environment_retention_apply(environment_id=environment.pk),
        entered)

    assert reported[1] is True and waited >= HOLD_S * 0.8
    assert went["snapshots"] == 1 and Snapshot.objects.filter(pk=s[1].pk).exists()


def test_the_database_refuses_a_delete_retention_did_not_name(world):
    _, s, _ = world
    with pytest.raises(IntegrityError, match="removed only by retention"), transaction.atomic():
        Snapshot.objects.filter(pk=s[0].pk).delete()
    with pytest.raises(IntegrityError, match="immutable"), transaction.atomic():
        Snapshot.objects.filter(pk=s[1].pk).update(parent=s[2].pk)
    with transaction.atomic():  # lineage may be emptied (retention removing the parent)
        Snapshot.objects.filter(pk=s[1].pk).update(parent=None)
    assert Snapshot.objects.filter(pk=s[0].pk).exists()
