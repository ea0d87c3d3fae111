"""A wave's limits: max in flight (only N of its agents get the new snapshot pinned
at a time, more as they report) and max failures (the wave stops: the rollout
pauses), enforced by reconcile, set-based (the same queries for 20 agents as 200)."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.rollouts import inflight, reconcile, services
from apps.rollouts.models import RolloutTarget
from tests.factories import ack, staged_environment, start_rollout
from tests.rollouts.support import fresh, pins, target_states
from tests.rollouts.test_scale import _acknowledge_wave, _bulk_agents

pytestmark = pytest.mark.django_db


@pytest.fixture
def nodes(fleet, second):
    return fleet(5)


def _limited(environment, second, nodes, **limits):
    return start_rollout(environment, second, nodes[:1], canary_gate="auto",
                         failure_threshold=limits.pop("failure_threshold", 0),
                         waves=[{"percent": 100, "gate": "auto", **limits}])


def _activated(rollout) -> list[str]:
    return sorted(name for name, state in target_states(rollout).items()
                  if state == "activated")


def test_only_max_in_flight_agents_get_the_snapshot_until_they_report(
        environment, second, nodes):
    rollout = _limited(environment, second, nodes, max_in_flight=2)
    ack(nodes[0], second)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"
    assert _activated(rollout) == ["web-1", "web-2", "web-3"]
    assert pins(nodes[3:]) == {"web-4": (1, rollout.pk), "web-5": (1, rollout.pk)}

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "waiting"  # none reported
    ack(nodes[1], second)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "topped_up"
    assert _activated(rollout) == ["web-1", "web-2", "web-3", "web-4"]
    assert pins(nodes[3:4]) == {"web-4": (2, rollout.pk)}

    for node in nodes[2:4]:
        ack(node, second)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "topped_up"
    ack(nodes[4], second)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"
    assert fresh(rollout).state == "completed"


def test_a_failed_report_also_frees_a_place_in_flight(environment, second, nodes):
    rollout = _limited(environment, second, nodes, max_in_flight=1, failure_threshold=3)
    ack(nodes[0], second)
    reconcile.rollout_reconcile(rollout_id=rollout.pk)
    assert inflight.in_flight(fresh(rollout), 1) == 1
    ack(nodes[1], second, status="failed")
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "topped_up"
    assert _activated(rollout) == ["web-1", "web-2", "web-3"]


def test_a_wave_stops_after_its_max_failures(environment, second, nodes):
    rollout = _limited(environment, second, nodes, max_failures=2, failure_threshold=4)
    ack(nodes[0], second)
    reconcile.rollout_reconcile(rollout_id=rollout.pk)
    ack(nodes[1], second, status="failed")
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "waiting"
    ack(nodes[2], second, status="failed")

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "stopped"
    stopped = fresh(rollout)
    assert stopped.state == "paused"
    assert "stopped after 2 failure(s)" in stopped.reason
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "idle"


def test_without_limits_failures_within_the_threshold_do_not_stop_a_wave(
        environment, second, nodes):
    rollout = _limited(environment, second, nodes, failure_threshold=4)
    ack(nodes[0], second)
    reconcile.rollout_reconcile(rollout_id=rollout.pk)
    for node in nodes[1:3]:
        ack(node, second, status="failed")
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "waiting"
    assert fresh(rollout).state == "running"


def test_the_rollout_failure_threshold_still_rolls_back_first(environment, second, nodes):
    rollout = _limited(environment, second, nodes, max_failures=3, failure_threshold=0)
    ack(nodes[0], second, status="failed")
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "rolled_back"


def _top_up_queries(application, superuser, count: int) -> int:
    env, _, second = staged_environment(application, f"flight{count}", superuser)
    ids = _bulk_agents(env, count)
    rollout = services.rollout_create(
        environment=env, snapshot=second, actor=None, canary_agents=ids[:1],
        canary_gate="auto", waves=[{"percent": 100, "gate": "auto",
                                    "max_in_flight": count // 10, "max_failures": 5}],
        failure_threshold=10)
    _acknowledge_wave(fresh(rollout), 0)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"
    assert RolloutTarget.objects.filter(rollout=rollout, state="activated").count() == (
        1 + count // 10)
    _acknowledge_wave(fresh(rollout), 1)
    with CaptureQueriesContext(connection) as captured:
        assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "topped_up"
    assert RolloutTarget.objects.filter(rollout=rollout, state="activated").count() == (
        1 + 2 * (count // 10))
    return len(captured.captured_queries)


def test_topping_up_a_wave_takes_as_many_queries_for_200_agents_as_for_20(
        application, superuser):
    assert _top_up_queries(application, superuser, 20) == _top_up_queries(
        application, superuser, 200)
