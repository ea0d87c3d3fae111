"""Rollout transitions under concurrency, on PostgreSQL with real row locks.

Two ways to make transitions meet:
- a barrier releases threads together, so their checks race as they would in
  production (the winner is whoever locks first);
- `_in_lock_order` holds the environment's row lock in the test's own connection,
  starts the calls one by one, each only once the previous one is seen waiting
  on that lock, then lets go: the first call locks first, the second acts
  right after it. Their environment has a template that takes ~0.3 s to
  render, so a rollback that re-rendered outside its locks would surely let the
  second call in between (an earlier version did: both won, or two replacement
  snapshots were made, or a completed rollout was left on the old content).
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import ApplicationError, Conflict
from apps.environments.models import Environment
from apps.fleet.models import Agent
from apps.releases import services as releases
from apps.rollouts import reconcile, services
from apps.rollouts.models import ACTIVE_STATES, Rollout, SnapshotQuarantine
from apps.snapshots.models import Snapshot
from tests import factories
from tests.factories import (
    ack,
    enrolled_agents,
    publish_variant,
    staged_environment,
    start_rollout,
)
from tests.rollouts.support import fresh

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 60
ROUNDS = 6
THREE_WAVES = [{"count": 1, "gate": "manual"}, {"percent": 100, "gate": "manual"}]


def _outcome(call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
        return exc
    finally:
        connection.close()


def _race(calls) -> list:
    """Run every call in its own thread at the same moment; each returns its result
    or the exception it raised."""
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait(timeout=TIMEOUT_S)
        return _outcome(call)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls, timeout=TIMEOUT_S))


def _waiting_on_locks() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")  # else frozen for the transaction
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]


def _in_lock_order(environment, calls) -> list:
    """Queue the calls on the environment's row lock in the given order, then release
    them; returns each call's result or exception."""
    results: list = [None] * len(calls)

    def run(index, call):
        results[index] = _outcome(call)

    threads = []
    with transaction.atomic():
        Environment.objects.select_for_update().get(pk=environment.pk)
        for index, call in enumerate(calls):
            thread = threading.Thread(target=run, args=(index, call), daemon=True)
            thread.start()
            threads.append(thread)
            deadline = time.monotonic() + TIMEOUT_S
            while _waiting_on_locks() < index + 1:
                assert time.monotonic() < deadline, "the call never queued on the lock"
                time.sleep(0.01)
    for thread in threads:
        thread.join(TIMEOUT_S)
        assert not thread.is_alive()
    return results


def _ready_to_confirm(application, superuser, name: str, canaries: int = 1,
                      slow_render: bool = True):
    """An environment with a running rollout of 3 agents whose canary wave is fully
    acknowledged; with 3 canaries, confirming it completes the rollout."""
    env, _, second = staged_environment(application, name, superuser,
                                        slow_render=slow_render)
    nodes = enrolled_agents(env, 3)
    rollout = start_rollout(env, second, nodes[:canaries], waves=THREE_WAVES)
    for node in nodes[:canaries]:
        ack(node, second)
    return env, fresh(rollout)


def _is_conflict(outcome) -> bool:
    return isinstance(outcome, Conflict) and outcome.status == 409


def _confirm(rollout, version):
    return lambda: services.rollout_confirm(rollout=rollout, expected_version=version,
                                            actor=None)


def _rollback(rollout, version):
    return lambda: services.rollout_rollback(rollout=rollout, expected_version=version,
                                             actor=None, reason="operator")


def test_confirm_and_rollback_racing_at_one_version_exactly_one_wins(application, superuser):
    for round_ in range(ROUNDS):  # either may lock first: try both more than once
        _, rollout = _ready_to_confirm(application, superuser, f"race-{round_}",
                                       slow_render=False)

        outcomes = _race([_confirm(rollout, rollout.version),
                          _rollback(rollout, rollout.version)])

        winners = [o for o in outcomes if isinstance(o, Rollout)]
        assert len(winners) == 1, (round_, outcomes)
        loser = next(o for o in outcomes if not isinstance(o, Rollout))
        assert _is_conflict(loser) and loser.code == "stale", outcomes
        assert fresh(rollout).version == rollout.version + 1
        winner = winners[0]
        assert (winner.state, fresh(rollout).state) in {("running", "running"),
                                                        ("rolled_back", "rolled_back")}


def test_a_confirm_queued_before_a_rollback_wins_and_the_rollback_gets_409(application,
                                                                          superuser):
    env, rollout = _ready_to_confirm(application, superuser, "confirm-first")
    snapshots = Snapshot.objects.filter(environment=env).count()

    confirmed, rolled_back = _in_lock_order(env, [_confirm(rollout, rollout.version),
                                                  _rollback(rollout, rollout.version)])

    assert isinstance(confirmed, Rollout) and confirmed.current_wave == 1
    assert _is_conflict(rolled_back) and rolled_back.code == "stale"
    assert (fresh(rollout).state, fresh(rollout).current_wave) == ("running", 1)
    assert Snapshot.objects.filter(environment=env).count() == snapshots


def test_a_rollback_queued_before_a_confirm_wins_and_the_confirm_gets_409(application,
                                                                          superuser):
    env, rollout = _ready_to_confirm(application, superuser, "rollback-first")

    rolled_back, confirmed = _in_lock_order(env, [_rollback(rollout, rollout.version),
                                                  _confirm(rollout, rollout.version)])

    assert isinstance(rolled_back, Rollout) and rolled_back.state == "rolled_back"
    assert _is_conflict(confirmed) and confirmed.code == "stale", confirmed
    assert (fresh(rollout).state, fresh(rollout).current_wave) == ("rolled_back", 0)


def test_a_final_confirm_that_locks_first_completes_and_the_rollback_gets_409(application,
                                                                              superuser):
    env, rollout = _ready_to_confirm(application, superuser, "final-confirm", canaries=3)
    assert len(rollout.waves) == 1  # confirming it completes the rollout

    confirmed, rolled_back = _in_lock_order(env, [_confirm(rollout, rollout.version),
                                                  _rollback(rollout, rollout.version)])

    env.refresh_from_db()
    assert isinstance(confirmed, Rollout) and confirmed.state == "completed"
    assert _is_conflict(rolled_back) and rolled_back.code == "stale"
    assert env.active_snapshot_id == rollout.snapshot_id
    assert not SnapshotQuarantine.objects.filter(snapshot=rollout.snapshot).exists()


def test_a_rollback_that_locks_before_the_final_confirm_leaves_its_replacement_active(
        application, superuser):
    env, rollout = _ready_to_confirm(application, superuser, "final-rollback", canaries=3)

    rolled_back, confirmed = _in_lock_order(env, [_rollback(rollout, rollout.version),
                                                  _confirm(rollout, rollout.version)])

    env.refresh_from_db()
    done = fresh(rollout)
    assert isinstance(rolled_back, Rollout) and done.state == "rolled_back"
    assert _is_conflict(confirmed) and confirmed.code == "stale"
    assert env.active_snapshot_id == done.rollback_snapshot_id
    assert SnapshotQuarantine.objects.filter(snapshot=rollout.snapshot).exists()


def test_two_racing_rollbacks_render_one_replacement_snapshot(application, superuser):
    env, rollout = _ready_to_confirm(application, superuser, "two-rollbacks")
    snapshots = Snapshot.objects.filter(environment=env).count()

    winner, loser = _in_lock_order(env, [_rollback(rollout, rollout.version),
                                         _rollback(rollout, rollout.version)])

    env.refresh_from_db()
    done = fresh(rollout)
    assert isinstance(winner, Rollout), winner
    assert _is_conflict(loser) and loser.code == "stale", loser
    assert env.active_snapshot_id == done.rollback_snapshot_id
    assert Snapshot.objects.filter(environment=env).count() == snapshots + 1


def test_concurrent_creates_for_one_environment_start_exactly_one_rollout(application,
                                                                         superuser):
    env, _, second = staged_environment(application, "creates", superuser)
    nodes = enrolled_agents(env, 4)

    outcomes = _race([(lambda n=n: start_rollout(env, second, [n])) for n in nodes])

    started = [o for o in outcomes if isinstance(o, Rollout)]
    refused = [o for o in outcomes if not isinstance(o, Rollout)]
    assert len(started) == 1, outcomes
    assert all(_is_conflict(o) and o.code == "rollout_active" for o in refused), refused
    assert Rollout.objects.filter(environment=env, state__in=("running", "paused")).count() == 1


def test_concurrent_reconciles_advance_an_acknowledged_wave_once(application, superuser):
    env, _, second = staged_environment(application, "reconciles", superuser)
    nodes = enrolled_agents(env, 3)
    rollout = start_rollout(env, second, nodes[:1], canary_gate="auto", bake_s=60,
                            waves=[{"count": 1}, {"percent": 100}])
    ack(nodes[0], second)  # its reconcile on commit finds the wave not yet baked
    assert fresh(rollout).current_wave == 0
    Rollout.objects.filter(pk=rollout.pk).update(
        wave_started_at=timezone.now() - timedelta(seconds=61))
    version = fresh(rollout).version

    outcomes = _race([lambda: reconcile.rollout_reconcile(rollout_id=rollout.pk)] * 4)

    assert not [o for o in outcomes if isinstance(o, ApplicationError)], outcomes
    assert sorted(outcomes) == ["advanced", "waiting", "waiting", "waiting"]
    assert (fresh(rollout).current_wave, fresh(rollout).version) == (1, version + 1)


def _release_pins(rollout, version):
    return lambda: services.rollout_pins_release(rollout=rollout, expected_version=version,
                                                 actor=None)


def _rolled_back_keeping_pins(application, superuser, name: str):
    """A rollout rolled back in an environment that keeps rollout pins: its two
    pending targets are still held by it."""
    env, rollout = _ready_to_confirm(application, superuser, name, slow_render=False)
    releases.environment_update(environment=env, keep_rollout_pins=True, actor=superuser)
    services.rollout_rollback(rollout=rollout, expected_version=rollout.version, actor=None)
    assert Agent.objects.filter(pin_rollout=rollout).count() == 2
    return fresh(rollout)


def test_two_people_releasing_a_rollouts_pins_at_one_version_exactly_one_wins(application,
                                                                              superuser):
    for round_ in range(ROUNDS):
        rollout = _rolled_back_keeping_pins(application, superuser, f"pins-{round_}")

        outcomes = _race([_release_pins(rollout, rollout.version),
                          _release_pins(rollout, rollout.version)])

        winners = [o for o in outcomes if isinstance(o, Rollout)]
        assert len(winners) == 1, (round_, outcomes)
        loser = next(o for o in outcomes if not isinstance(o, Rollout))
        assert _is_conflict(loser) and loser.code == "stale", outcomes
        assert fresh(rollout).version == rollout.version + 1
        assert not Agent.objects.filter(pin_rollout=rollout).exists()
        assert AuditEvent.objects.filter(action="rollout.pins_release",
                                         object_id=str(rollout.pk)).count() == 1


def test_releasing_pins_racing_a_rollback_the_rollback_wins_and_no_pin_is_left(
        application, superuser):
    for round_ in range(ROUNDS):
        env, rollout = _ready_to_confirm(application, superuser, f"rb-pins-{round_}",
                                         slow_render=False)

        outcomes = _race([_rollback(rollout, rollout.version),
                          _release_pins(rollout, rollout.version)])

        # Only a finished rollout's pins are released: first, the rollout is still
        # running; after the rollback, the version moved on. Either way one wins.
        assert isinstance(outcomes[0], Rollout), (round_, outcomes)
        assert _is_conflict(outcomes[1]) and outcomes[1].code in (
            "rollout_active", "stale"), outcomes
        assert fresh(rollout).state == "rolled_back"
        assert not Agent.objects.filter(pin_rollout=rollout).exists()


def _history_of(env, node, rounds: int, superuser) -> list[Rollout]:
    """`rounds` finished rollouts of `env` (each of a new variant, rolled back)."""
    done = []
    for workers in range(30, 30 + rounds):
        snapshot = publish_variant(env, superuser, workers=workers)
        rollout = start_rollout(env, snapshot, [node])
        done.append(services.rollout_rollback(rollout=rollout, actor=None, reason="history",
                                              expected_version=fresh(rollout).version))
    return done


@override_settings(BELLWETHER_ROLLOUT_LIMITS={"max_targets": 10_000, "max_active": 1,
                                              "max_history": 2})
def test_two_tenants_starting_rollouts_at_once_are_bounded_each_on_its_own(application,
                                                                         superuser):
    """Tenant A starts rollouts in two environments while tenant B starts one, all at
    once, every history full: A gets one (its tenant-wide active bound), B gets its
    own, and each environment prunes only its own history."""
    a_envs = [staged_environment(application, name, superuser) for name in ("eu", "us")]
    other = factories.tenant(actor=superuser, name="Other team", slug="other-team")
    b_env = staged_environment(factories.application(other, actor=superuser, name="blog"),
                               "prod", superuser)
    starts, histories = [], {}
    for env, _, _ in (*a_envs, b_env):
        node, = enrolled_agents(env, 1, prefix=env.name)
        histories[env.pk] = {r.pk for r in _history_of(env, node, 2, superuser)}
        snapshot = publish_variant(env, superuser, workers=99)
        starts.append(lambda env=env, s=snapshot, n=node: start_rollout(env, s, [n]))

    outcomes = _race(starts)

    a_outcomes, b_outcome = outcomes[:2], outcomes[2]
    assert isinstance(b_outcome, Rollout), outcomes
    assert sum(isinstance(o, Rollout) for o in a_outcomes) == 1, outcomes
    refused = next(o for o in a_outcomes if not isinstance(o, Rollout))
    assert _is_conflict(refused) and refused.code == "too_many_rollouts", outcomes
    for env_pk, before in histories.items():
        kept = set(Rollout.objects.filter(environment=env_pk)
                   .exclude(state__in=ACTIVE_STATES).values_list("pk", flat=True))
        started = any(isinstance(o, Rollout) and o.environment_id == env_pk
                      for o in outcomes)
        assert kept == (set(sorted(before)[1:]) if started else before), env_pk
