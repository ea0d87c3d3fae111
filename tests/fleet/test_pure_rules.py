"""The fleet's pure rules (apps.fleet.rules), without a database."""

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from apps.fleet.rules import (
    held_by,
    holder_text,
    is_held,
    labels_problem,
    push_refusal,
    report_changes,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def agent(pk=1, name="web-1", *, enabled=True, mode="auto_pull", applied=None,
          blocked=None, pinned=None, rollout=None):
    return SimpleNamespace(pk=pk, name=name, enabled=enabled, mode=mode,
                           applied_number=applied, applied_checksum="c" if applied else "",
                           blocked_number=blocked, blocked_checksum="b" if blocked else "",
                           pinned_snapshot_id=pinned, pin_rollout_id=rollout)


def snapshot(pk, number):
    return SimpleNamespace(pk=pk, number=number)


@pytest.mark.parametrize(("pinned", "rollout", "held"), [
    (None, None, False), (7, None, True), (None, 3, True), (7, 3, True)])
def test_an_agent_is_held_by_an_operators_or_a_rollouts_pin(pinned, rollout, held):
    assert is_held(agent(pinned=pinned, rollout=rollout)) is held


def test_a_push_of_the_active_snapshot_to_followers_goes_ahead():
    active = snapshot(10, 2)
    assert push_refusal([agent(applied=1), agent(2, "web-2")], active, active) is None


def test_a_push_to_a_disabled_agent_names_it():
    refusal = push_refusal([agent(enabled=False), agent(2, "web-2", enabled=False)],
                           snapshot(1, 1), snapshot(1, 1))
    assert (refusal.code, refusal.message) == (
        "agent_disabled", "Agents web-1, web-2 are disabled; enable them to push.")


def test_a_push_to_a_held_agent_is_refused_before_anything_else():
    refusal = push_refusal([agent(rollout=4, applied=9)], snapshot(1, 1), None)
    assert refusal.code == "agent_pinned"


def test_a_push_of_a_newer_snapshot_not_yet_active_asks_for_activation():
    refusal = push_refusal([agent(applied=1)], snapshot(11, 3), snapshot(10, 2))
    assert refusal.code == "not_active"
    assert refusal.details == [{"agent": 1, "name": "web-1", "reason":
                                "follows the active snapshot; activate this one first"}]


def test_a_push_that_would_move_any_agent_back_needs_a_rollback():
    refusal = push_refusal([agent(mode="manual", applied=5), agent(2, "web-2")],
                           snapshot(11, 3), snapshot(10, 2))
    assert refusal.code == "rollback_required"
    assert [d["reason"] for d in refusal.details] == [
        "has #5 active; it refuses lower numbers",
        "follows the active snapshot; activate this one first"]


def test_a_push_of_an_older_snapshot_to_a_follower_says_it_would_switch_back():
    refusal = push_refusal([agent()], snapshot(9, 1), snapshot(10, 2))
    assert refusal.code == "rollback_required"
    assert refusal.details[0]["reason"] == "follows the active #2; it would switch back"


def test_manual_agents_take_any_snapshot_not_older_than_theirs():
    assert push_refusal([agent(mode="manual", applied=2)], snapshot(9, 3), None) is None


def test_a_success_moves_the_applied_snapshot_forward_and_lifts_older_blocks():
    changes = report_changes(agent(applied=2, blocked=3), number=3, checksum="x",
                             status="succeeded", message="", now=NOW)
    assert changes == {"last_status": "succeeded", "last_message": "", "last_report_at": NOW,
                       "last_health": None, "applied_number": 3, "applied_checksum": "x",
                       "blocked_number": None, "blocked_checksum": ""}


@pytest.mark.parametrize("status", ["succeeded", "warning", "failed"])
def test_a_late_report_of_an_older_snapshot_than_the_applied_one_changes_nothing(status):
    assert report_changes(agent(applied=5, blocked=6), number=4, checksum="x",
                          status=status, message="late", now=NOW) == {}


def test_a_failure_of_the_applied_snapshot_itself_is_current():
    changes = report_changes(agent(applied=5), number=5, checksum="c", status="failed",
                             message="reload failed", now=NOW)
    assert changes == {"last_status": "failed", "last_message": "reload failed",
                       "last_report_at": NOW, "last_health": None, "blocked_number": 5,
                       "blocked_checksum": "c"}


def test_a_first_report_of_an_agent_that_applied_nothing_is_current():
    changes = report_changes(agent(), number=1, checksum="x", status="succeeded",
                             message="", now=NOW)
    assert changes == {"last_status": "succeeded", "last_message": "", "last_report_at": NOW,
                       "last_health": None, "applied_number": 1, "applied_checksum": "x"}


@pytest.mark.parametrize("status", ["failed", "warning"])
def test_a_failure_or_warning_blocks_its_snapshot_and_keeps_what_is_applied(status):
    changes = report_changes(agent(applied=2), number=3, checksum="x", status=status,
                             message="boom", now=NOW)
    assert changes == {"last_status": status, "last_message": "boom", "last_report_at": NOW,
                       "last_health": None, "blocked_number": 3, "blocked_checksum": "x"}


def test_a_report_keeps_its_health_probe_on_the_agent_and_a_late_one_does_not():
    unhealthy = {"ok": False, "attempts": 3, "output": "HTTP 502", "probe": "url"}

    changes = report_changes(agent(applied=2), number=3, checksum="x", status="warning",
                             message="restored #2", now=NOW, health=unhealthy)
    late = report_changes(agent(applied=5), number=3, checksum="x", status="warning",
                          message="restored #2", now=NOW, health=unhealthy)

    assert changes["last_health"] == unhealthy and changes["blocked_number"] == 3
    assert late == {}


@pytest.mark.parametrize("labels", [
    [], "role=web", {"": "x"}, {"k" * 64: "x"}, {"k": "v" * 256}, {"k": 1},
    {f"k{i}": "v" for i in range(33)}])
def test_labels_that_are_not_short_string_pairs_are_refused(labels):
    assert "labels must be an object" in labels_problem(labels)


def test_labels_within_bounds_are_fine():
    assert labels_problem({"role": "web", "k" * 63: "v" * 255}) is None


def test_the_rules_name_the_models_choices():
    from apps.fleet import rules
    from apps.fleet.models import Agent, Deployment

    assert rules.SUCCEEDED == Deployment.State.SUCCEEDED
    assert rules.AUTO_PULL == Agent.Mode.AUTO_PULL


@pytest.mark.parametrize(("applied", "number", "refused"), [
    (None, None, False), (None, 1, False), (3, 3, False), (3, 4, False), (3, 2, True),
    (3, None, True)])
def test_an_agent_refuses_only_snapshots_older_than_what_it_applied(applied, number, refused):
    from apps.fleet.rules import refuses

    assert refuses(agent(applied=applied), number) is refused


def test_held_by_names_a_rollout_or_an_operator_and_nothing_else():
    operator = SimpleNamespace(pinned_by_id=3, pinned_by=SimpleNamespace(username="ana"))
    by_operator = SimpleNamespace(**vars(agent(pinned=2)), **vars(operator))
    by_rollout = SimpleNamespace(**vars(agent(pinned=2, rollout=7)), pinned_by_id=None)

    assert held_by(agent()) is None
    assert held_by(by_rollout) == {"kind": "rollout", "rollout": 7}
    assert held_by(by_operator) == {"kind": "operator", "by": "ana"}


def test_a_refusal_by_a_pin_names_the_holder_and_what_frees_it():
    held = SimpleNamespace(**vars(agent(pk=4, name="web-2", rollout=7)), pinned_by_id=None)

    refusal = push_refusal([held], SimpleNamespace(number=3, pk=3), None)

    assert holder_text(held) == (
        "web-2 is held by rollout 7; release that rollout's pins "
        "(POST /api/v1/rollouts/7/release-pins) or roll it back")
    assert refusal.code == "agent_pinned" and holder_text(held) in refusal.message
    assert refusal.details == [{"agent": 4, "name": "web-2",
                                "held_by": {"kind": "rollout", "rollout": 7}}]
