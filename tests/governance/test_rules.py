"""The governance rules, pure: plans and digests, approvals missing, windows in
their timezones (DST), overlaps, holds, and a schedule's compare-and-set."""

from datetime import UTC, datetime, time, timedelta

from apps.governance import rules
from apps.governance.rules import Decision, Window

ROME = "Europe/Rome"


def test_one_plan_spelled_two_ways_has_one_digest():
    a = rules.rollout_plan(canary_agents=[3, 1], waves=[{"percent": 50}])
    b = rules.rollout_plan(canary_agents=[1, 3, 3], waves=[{"percent": 50, "gate": "auto",
                                                             "bake_s": 0}])
    assert rules.plan_digest(a) == rules.plan_digest(b)
    assert rules.plan_digest(a) != rules.plan_digest(rules.rollout_plan(canary_agents=[1]))


def test_a_push_to_no_named_agent_is_to_all():
    assert rules.push_plan(None) == rules.push_plan([]) == {"kind": "push", "agents": "all"}


def _rule(required=2, strict=False, groups=()):
    return rules.frozen_rule(required=required, owners_approve=True, groups=list(groups),
                             admins_may_skip=False, strict=strict, version=1)


def test_two_eligible_approvals_satisfy_a_rule_of_two():
    decisions = [Decision("alice", "approve", True), Decision("bob", "approve", True)]
    assert rules.approvals_missing(rule=_rule(), decisions=decisions, skipped=False) is None


def test_ineligible_approvals_do_not_count_and_a_rejection_holds():
    decisions = [Decision("alice", "approve", True), Decision("eve", "approve", False)]
    missing = rules.approvals_missing(rule=_rule(), decisions=decisions, skipped=False)
    assert (missing["given"], missing["missing"]) == (1, 1)
    decisions = [Decision("a", "approve", True), Decision("b", "approve", True),
                 Decision("c", "reject", True, "no")]
    assert rules.approvals_missing(rule=_rule(), decisions=decisions,
                                   skipped=False)["rejected_by"] == [{"by": "c",
                                                                      "comment": "no"}]


def test_the_submitted_rule_binds_unless_the_current_is_strict():
    submitted, stricter = _rule(1), _rule(3)
    assert rules.rule_in_force(submitted=submitted, current=stricter) is submitted
    strict = _rule(3, strict=True)
    assert rules.rule_in_force(submitted=submitted, current=strict) is strict


def test_a_release_submitted_while_ungoverned_is_held_to_the_rule_in_force():
    """It was given no approval to keep: a rule arriving later decides (hostile
    finding: a release asked for before governance started went out unapproved)."""
    ungoverned, governed = _rule(0), _rule(2)
    assert rules.rule_in_force(submitted=ungoverned, current=governed) is governed


def test_the_author_never_approves_and_others_need_a_group_or_ownership():
    assert "author" in rules.approver_refusal(is_author=True, is_member=True, is_owner=True,
                                              groups=set(), rule=_rule())
    assert rules.approver_refusal(is_author=False, is_member=True, is_owner=False,
                                  groups={"sre"}, rule=_rule(groups=["sre"])) is None
    assert "members of sre" in rules.approver_refusal(
        is_author=False, is_member=True, is_owner=False, groups=set(),
        rule=_rule(groups=["sre"]))


def test_an_editor_never_approves_and_a_group_spans_no_tenant():
    # An editor of the release is one of its authors (the caller says so).
    assert "author" in rules.approver_refusal(is_author=True, is_member=True, is_owner=False,
                                              groups={"sre"}, rule=_rule(groups=["sre"]))
    assert "tenant" in rules.approver_refusal(is_author=False, is_member=False,
                                              is_owner=False, groups={"sre"},
                                              rule=_rule(groups=["sre"]))
    assert "only the environment's owners" in rules.approver_refusal(
        is_author=False, is_member=True, is_owner=False, groups={"editors"}, rule=_rule())


def test_a_bad_timezone_is_no_zone():
    for name in ("Mars/Olympus", "", "../etc/passwd", "/etc/localtime", "x" * 100):
        assert rules.zone(name) is None
    assert rules.zone(ROME) is not None


def _weekly(name="w", kind="freeze", days=(4,), start=time(15), end=time(23), tz=ROME):
    return Window(name=name, kind=kind, timezone=tz, weekdays=tuple(days), start_time=start,
                  end_time=end)


def test_a_weekly_window_follows_wall_clock_time_across_dst():
    friday = _weekly()
    # 2025-03-28 is a Friday in CET (UTC+1); 2025-04-04 a Friday in CEST (UTC+2).
    assert rules.window_open_at(friday, datetime(2025, 3, 28, 14, 30, tzinfo=UTC))
    assert not rules.window_open_at(friday, datetime(2025, 3, 28, 13, 30, tzinfo=UTC))
    assert rules.window_open_at(friday, datetime(2025, 4, 4, 13, 30, tzinfo=UTC))
    assert not rules.window_open_at(friday, datetime(2025, 4, 4, 21, 30, tzinfo=UTC))


def test_a_window_ending_before_it_starts_runs_past_midnight():
    night = _weekly(days=(0,), start=time(22), end=time(6), tz="UTC")
    assert rules.window_open_at(night, datetime(2025, 3, 4, 5, 0, tzinfo=UTC))  # Tuesday 05:00
    assert not rules.window_open_at(night, datetime(2025, 3, 4, 7, 0, tzinfo=UTC))


def test_overlapping_windows_are_found_across_timezones():
    now = datetime(2025, 1, 1, tzinfo=UTC)
    rome = _weekly(days=(4,), start=time(15), end=time(16))  # 14:00-15:00 UTC in winter
    london = _weekly(days=(4,), start=time(14, 30), end=time(15), tz="Europe/London")
    assert rules.windows_overlap(rome, london, now) is not None
    later = _weekly(days=(4,), start=time(16), end=time(17))
    assert rules.windows_overlap(rome, later, now) is None
    once = Window(name="o", kind="freeze", timezone="UTC", starts_at=now,
                  ends_at=now + timedelta(days=3))
    assert rules.windows_overlap(once, rome, now) is not None  # Friday 2025-01-03


def test_a_hold_names_the_freeze_or_the_allow_windows_and_an_override_lifts_it():
    at = datetime(2025, 3, 28, 14, 30, tzinfo=UTC)
    hold = rules.release_hold(freezes=[_weekly(name="friday")], allows=[], at=at,
                              overridden=False)
    assert hold["reason"] == "freeze" and hold["window"] == "friday"
    allow = _weekly(name="mornings", kind="allow", days=(0, 1, 2, 3), start=time(9),
                    end=time(12))
    hold = rules.release_hold(freezes=[], allows=[allow], at=at, overridden=False)
    assert hold["reason"] == "outside_allow_windows" and hold["until"].startswith("2025-03-31")
    assert rules.release_hold(freezes=[_weekly()], allows=[allow], at=at,
                              overridden=True) is None


def test_a_schedule_fails_when_the_active_snapshot_or_the_release_changed():
    same = {"expected_active": 1, "active": 1, "expected_version": 1, "version": 1,
            "state": "open"}
    assert rules.schedule_changed(**same) is None
    assert rules.schedule_changed(**{**same, "active": 3})["reason"] == "active_changed"
    assert rules.schedule_changed(**{**same, "version": 2})["reason"] == "release_changed"
    assert rules.schedule_changed(**{**same, "state": "withdrawn"})["reason"] == "release_closed"
