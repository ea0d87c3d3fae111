"""Wave transitions over many targets are set-based: creating a rollout, advancing
a wave (by reconcile and by confirm) and completing it take as many queries for
10,000 targets as for 100 — only the batched INSERT of the target rows grows.

Agents are made straight in the database (bulk_create) to keep this fast; their
acknowledgements likewise (the rows a report writes: a pulled deployment and the
agent's applied snapshot). Runs on SQLite and on PostgreSQL.
"""

import math

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.fleet.models import Agent, Deployment
from apps.rollouts import reconcile, services
from apps.rollouts.models import Rollout, RolloutTarget
from tests.factories import ack
from tests.rollouts.support import confirm, fresh

pytestmark = pytest.mark.django_db

SMALL, LARGE = 100, 10_000
TRANSITION_MAX_QUERIES = 20
# Completing also keeps the rollout's per-wave summary: a few queries per wave
# (its evidence), none per target.
COMPLETE_MAX_QUERIES = 32
CREATE_MAX_QUERIES = 30  # plus the batched INSERTs of the target rows
TARGET_INSERT = 'INSERT INTO "rollouts_rollouttarget"'


def _bulk_agents(environment, count: int, prefix: str) -> list[int]:
    Agent.objects.bulk_create([
        Agent(environment=environment, name=f"{prefix}-{i}", token_key=f"{prefix}{i:014d}",
              token_hash="0" * 64) for i in range(count)
    ], batch_size=2000)
    return list(Agent.objects.filter(environment=environment).order_by("pk")
                .values_list("pk", flat=True))


def _acknowledge_wave(rollout: Rollout, wave: int) -> None:
    """What every agent of the wave's report would have written, set-based."""
    snapshot, now = rollout.snapshot, timezone.now()
    ids = list(RolloutTarget.objects.filter(rollout=rollout, wave=wave)
               .values_list("agent_id", flat=True))
    Deployment.objects.bulk_create([
        Deployment(agent_id=i, snapshot=snapshot, kind=Deployment.Kind.PULL,
                   state=Deployment.State.SUCCEEDED, reported_checksum=snapshot.checksum,
                   reported_at=now) for i in ids
    ], batch_size=2000)
    Agent.objects.filter(pk__in=ids).update(
        applied_number=snapshot.number, applied_checksum=snapshot.checksum,
        last_status="succeeded", last_report_at=now)


def _queries(context) -> list[str]:
    return [q["sql"] for q in context.captured_queries]


def _transitions(environment, snapshot, count: int, prefix: str,
                 django_assert_max_num_queries) -> dict[str, list[str]]:
    """Run a rollout over `count` new agents: canary, 10 %, the rest. Returns the
    queries of each transition."""
    ids = _bulk_agents(environment, count, prefix)
    with django_assert_max_num_queries(CREATE_MAX_QUERIES + math.ceil(count / 100)) as create:
        rollout = services.rollout_create(
            environment=environment, snapshot=snapshot, actor=None, canary_agents=ids[:1],
            canary_gate="auto",
            waves=[{"percent": 10, "gate": "manual"}, {"percent": 100, "gate": "manual"}])
    assert [w["size"] for w in fresh(rollout).waves] == [1, count // 10, count - 1 - count // 10]

    ack(Agent.objects.get(pk=ids[0]), snapshot)
    with django_assert_max_num_queries(TRANSITION_MAX_QUERIES) as reconciled:
        assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"
    assert RolloutTarget.objects.filter(rollout=rollout, state="activated").count() == (
        1 + count // 10)

    _acknowledge_wave(fresh(rollout), 1)
    with django_assert_max_num_queries(TRANSITION_MAX_QUERIES) as confirmed:
        assert confirm(rollout).current_wave == 2
    assert not RolloutTarget.objects.filter(rollout=rollout, state="pending").exists()
    assert Agent.objects.filter(pk__in=ids, pinned_snapshot=snapshot).count() == count

    _acknowledge_wave(fresh(rollout), 2)
    with django_assert_max_num_queries(COMPLETE_MAX_QUERIES) as completed:
        assert confirm(rollout).state == "completed"
    assert not Agent.objects.filter(pk__in=ids, pin_rollout__isnull=False).exists()
    environment.refresh_from_db()
    assert environment.active_snapshot_id == snapshot.pk

    return {"create": _queries(create), "reconcile": _queries(reconciled),
            "confirm": _queries(confirmed), "complete": _queries(completed)}


def test_wave_transitions_take_as_many_queries_for_10000_targets_as_for_100(
        environment, second, staging, django_assert_max_num_queries):
    small = _transitions(environment, second, SMALL, "s", django_assert_max_num_queries)
    large = _transitions(staging[0], staging[2], LARGE, "l", django_assert_max_num_queries)

    for step in ("reconcile", "confirm", "complete"):
        assert len(large[step]) == len(small[step]), step

    def other_than_target_inserts(queries):
        return [q for q in queries if not q.startswith(TARGET_INSERT)]

    assert len(other_than_target_inserts(large["create"])) == len(
        other_than_target_inserts(small["create"]))
    inserts = len(large["create"]) - len(other_than_target_inserts(large["create"]))
    # Batched, never one per agent: the service's batches of 1,000 rows, or of 142 on
    # SQLite (its 999 query parameters over the 7 columns of a target row).
    assert inserts == {"postgresql": 10, "sqlite": 71}[connection.vendor]


def test_the_capture_sees_every_query_of_a_transition(environment, second, fleet):
    """Guards the test above: a transition's updates are captured as queries."""
    web1, web2 = fleet(2)
    with CaptureQueriesContext(connection) as captured:
        services.rollout_create(environment=environment, snapshot=second, actor=None,
                                canary_agents=[web1.pk])

    assert any(q.startswith('UPDATE "fleet_agent"') for q in _queries(captured))
