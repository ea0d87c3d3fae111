"""Rollouts are set-based: creating one, each wave's transition (by reconcile and by
confirm), completing it and rolling it back take the same number of queries for 10,
100 and 1,000 targets — the target rows are written by one INSERT … SELECT, the
pins by UPDATEs over subqueries. (Speed at 10,000 targets is bench/rollout_waves.py's.)

Agents are made straight in the database (bulk_create) to keep this fast; their
acknowledgements likewise (the rows a report writes: a pulled deployment and the
agent's applied snapshot). Runs on SQLite and on PostgreSQL.
"""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.fleet.models import Agent, Deployment
from apps.rollouts import reconcile, services
from apps.rollouts.models import Rollout, RolloutTarget
from tests.factories import ack, staged_environment
from tests.rollouts.support import confirm, fresh, rollback

pytestmark = pytest.mark.django_db

SIZES = (10, 100, 1_000)
# Upper bounds, so that a constant but bloated step shows too.
# create: one of them checks that the agents named are the environment's (unknown_agents).
MAX_QUERIES = {"create": 31, "reconcile": 20, "confirm": 20, "complete": 32, "rollback": 60}
TARGET_INSERT = 'INSERT INTO "rollouts_rollouttarget"'


def _bulk_agents(environment, count: int) -> list[int]:
    # token_key is 16 characters at most; PostgreSQL's ids grow past 999 in a long run.
    name, key = environment.name, f"k{environment.pk % 1000:03d}"
    Agent.objects.bulk_create([
        Agent(environment=environment, name=f"{name}-{i}", token_key=f"{key}{i:012d}",
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


def _start(environment, snapshot, count: int, queries: dict) -> tuple[Rollout, list[int]]:
    """A rollout over `count` new agents: one canary (automatic gate), 10 %, the rest."""
    ids = _bulk_agents(environment, count)
    with CaptureQueriesContext(connection) as captured:
        rollout = services.rollout_create(
            environment=environment, snapshot=snapshot, actor=None, canary_agents=ids[:1],
            canary_gate="auto",
            waves=[{"percent": 10, "gate": "manual"}, {"percent": 100, "gate": "manual"}])
    queries["create"] = [q["sql"] for q in captured.captured_queries]
    assert [w["size"] for w in fresh(rollout).waves] == [1, count // 10, count - 1 - count // 10]
    assert RolloutTarget.objects.filter(rollout=rollout).count() == count
    return rollout, ids


def _run_to_completion(environment, snapshot, count: int) -> dict[str, list[str]]:
    queries: dict[str, list[str]] = {}
    rollout, ids = _start(environment, snapshot, count, queries)
    ack(Agent.objects.get(pk=ids[0]), snapshot)
    with CaptureQueriesContext(connection) as captured:
        assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"
    queries["reconcile"] = [q["sql"] for q in captured.captured_queries]
    assert RolloutTarget.objects.filter(rollout=rollout, state="activated").count() == (
        1 + count // 10)

    _acknowledge_wave(fresh(rollout), 1)
    with CaptureQueriesContext(connection) as captured:
        assert confirm(rollout).current_wave == 2
    queries["confirm"] = [q["sql"] for q in captured.captured_queries]
    assert not RolloutTarget.objects.filter(rollout=rollout, state="pending").exists()
    assert Agent.objects.filter(pk__in=ids, pinned_snapshot=snapshot).count() == count

    _acknowledge_wave(fresh(rollout), 2)
    with CaptureQueriesContext(connection) as captured:
        assert confirm(rollout).state == "completed"
    queries["complete"] = [q["sql"] for q in captured.captured_queries]
    assert not Agent.objects.filter(pk__in=ids, pin_rollout__isnull=False).exists()
    environment.refresh_from_db()
    assert environment.active_snapshot_id == snapshot.pk
    assert fresh(rollout).final_summary["waves"][2]["acknowledged"] == count - 1 - count // 10
    return queries


def _roll_back_after_a_wave(environment, snapshot, count: int) -> dict[str, list[str]]:
    queries: dict[str, list[str]] = {}
    rollout, ids = _start(environment, snapshot, count, queries)
    _acknowledge_wave(fresh(rollout), 0)
    confirm(rollout)
    with CaptureQueriesContext(connection) as captured:
        assert rollback(rollout, reason="bad").state == "rolled_back"
    queries["rollback"] = [q["sql"] for q in captured.captured_queries]
    assert not Agent.objects.filter(pk__in=ids, pin_rollout__isnull=False).exists()
    assert not RolloutTarget.objects.filter(rollout=rollout).exclude(state="released").exists()
    return queries


def test_every_step_takes_as_many_queries_for_1000_targets_as_for_10(application, superuser):
    runs = {}
    for count in SIZES:
        env, _, second = staged_environment(application, f"done{count}", superuser)
        runs[count] = _run_to_completion(env, second, count)
        env, _, second = staged_environment(application, f"back{count}", superuser)
        runs[count].update(_roll_back_after_a_wave(env, second, count))

    counts = {count: {step: len(q) for step, q in steps.items()} for count, steps in runs.items()}
    assert counts[100] == counts[10], counts
    assert counts[1_000] == counts[10], counts
    for step, most in MAX_QUERIES.items():
        assert counts[10][step] <= most, (step, counts[10][step])
    # The targets are one statement, never a batch per thousand rows.
    assert len([q for q in runs[1_000]["create"] if q.startswith(TARGET_INSERT)]) == 1


def test_the_capture_sees_every_query_of_a_transition(environment, second, fleet):
    """Guards the test above: a transition's updates are captured as queries."""
    web1, web2 = fleet(2)
    with CaptureQueriesContext(connection) as captured:
        services.rollout_create(environment=environment, snapshot=second, actor=None,
                                canary_agents=[web1.pk])

    sql = [q["sql"] for q in captured.captured_queries]
    assert any(q.startswith('UPDATE "fleet_agent"') for q in sql)
    assert len([q for q in sql if q.startswith(TARGET_INSERT)]) == 1


def _row_updates(table: str) -> tuple[int, int]:
    """This transaction's (updated rows, of them rewritten on their own page with no
    index entry) on `table`, as PostgreSQL counts them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables"
                       " WHERE relname = %s", [table])
        return cursor.fetchone()


@pytest.mark.postgres
def test_a_step_rewrites_pins_and_states_without_touching_an_index(application, superuser):
    """The columns a step writes to ten thousand rows (an agent's pin and generation,
    a target's state) are not indexed and the tables keep room on their pages, so
    PostgreSQL rewrites each row on its own page, with no index entry
    (apps.core.storage). A new index on one of them breaks this test, not only the
    benchmark. Measured on each table's first rewrite: within the test's one
    transaction the old versions cannot be pruned, as they are between steps."""
    environment, _, second = staged_environment(application, "hot", superuser)
    count = 200
    ids = _bulk_agents(environment, count)

    agents_before = _row_updates("fleet_agent")
    rollout = services.rollout_create(environment=environment, snapshot=second, actor=None,
                                      canary_agents=ids[:1], canary_gate="manual",
                                      waves=[{"percent": 100, "gate": "manual"}])
    updated, hot = (now - then for now, then in zip(_row_updates("fleet_agent"), agents_before,
                                                    strict=True))
    # Every target's pin frozen, the canary's moved: none indexed.
    assert (updated, hot) == (count + 1, count + 1)

    _acknowledge_wave(fresh(rollout), 0)
    targets_before = _row_updates("rollouts_rollouttarget")
    confirm(rollout)
    updated, hot = (now - then for now, then in zip(_row_updates("rollouts_rollouttarget"),
                                                    targets_before, strict=True))
    # The canary confirmed, the other 199 targets activated: none indexed.
    assert (updated, hot) == (count - 1, count - 1)
