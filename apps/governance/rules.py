"""Governance rules, pure (no database): what a release's plan is, its digest, what
approvals count and what is missing, when a window is open, and whether two windows
overlap. Times are aware datetimes; windows' wall-clock times are read in their own
timezone through zoneinfo."""

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

ACTIVATE, PUSH, ROLLOUT = "activate", "push", "rollout"
PLAN_KINDS = (ACTIVATE, PUSH, ROLLOUT)
PLAN_AGENT_FIELDS = ("agents", "targets", "canary_agents")  # a plan's agent ids
MANUAL, AUTO = "manual", "auto"  # apps.rollouts.models.Rollout.Gate
GATE_CHOICES = [(MANUAL, "Manual confirm"), (AUTO, "Automatic")]  # the same choices
DEFAULT_WAVES = [{"percent": 100, "gate": AUTO, "bake_s": 0}]
# Weekly windows are compared over this horizon (a year: every DST change of a zone).
OVERLAP_HORIZON = timedelta(days=371)


# --- plans -------------------------------------------------------------------------------


def activation_plan() -> dict:
    return {"kind": ACTIVATE}


def push_plan(agent_ids: Iterable[int] | None) -> dict:
    """A push to those agents, or to every enabled agent (None or empty)."""
    return {"kind": PUSH, "agents": sorted(set(agent_ids)) if agent_ids else "all"}


def _wave(spec: dict) -> dict:
    """A wave in canonical form: its size, gate, bake time and its own limits (what
    an approval covers: a wave's pace is part of the plan)."""
    size = {"count": spec["count"]} if spec.get("count") is not None else {
        "percent": spec["percent"]}
    limits = {key: spec[key] for key in ("max_in_flight", "max_failures")
              if spec.get(key) is not None}
    return {**size, "gate": spec.get("gate") or AUTO, "bake_s": spec.get("bake_s") or 0,
            **limits}


def rollout_plan(*, targets: Iterable[int] | None = None,
                 canary_agents: Iterable[int] | None = None, canary_labels: dict | None = None,
                 waves: list[dict] | None = None, canary_gate: str = MANUAL, bake_s: int = 0,
                 failure_threshold: int = 0, wave_timeout_s: int = 3600) -> dict:
    """A rollout's plan as rollout_create takes it, in one canonical form whichever
    surface (API, dashboard, schedule) spelled it."""
    return {"kind": ROLLOUT, "targets": sorted(set(targets)) if targets else "all",
            "canary_agents": sorted(set(canary_agents or [])),
            "canary_labels": dict(sorted((canary_labels or {}).items())),
            "waves": [_wave(w) for w in (waves or DEFAULT_WAVES)],
            "canary_gate": canary_gate, "bake_s": bake_s,
            "failure_threshold": failure_threshold, "wave_timeout_s": wave_timeout_s}


def plan_digest(plan: dict) -> str:
    """SHA-256 of the plan's canonical JSON: what an approval names."""
    canonical = json.dumps(plan, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def describe_plan(plan: dict) -> str:
    if plan["kind"] == ROLLOUT:
        return f"a rollout in {len(plan['waves']) + 1} wave(s)"
    if plan["kind"] == PUSH:
        agents = plan["agents"]
        return "a push to every agent" if agents == "all" else f"a push to {len(agents)} agent(s)"
    return "an activation"


# --- approvals ---------------------------------------------------------------------------


def frozen_rule(*, required: int, owners_approve: bool, groups: list[str],
                admins_may_skip: bool, strict: bool, version: int) -> dict:
    """The rule as a release records it at submission."""
    return {"required": required, "owners_approve": owners_approve, "groups": sorted(groups),
            "admins_may_skip": admins_may_skip, "strict": strict, "version": version}


NO_RULE = frozen_rule(required=0, owners_approve=True, groups=[], admins_may_skip=False,
                      strict=False, version=0)


def rule_in_force(*, submitted: dict, current: dict) -> dict:
    """The rule a release is held to: the one it was submitted under, so a stricter
    rule arriving later invalidates no approval already given, unless the environment
    now says `strict`, or the release was submitted while the environment needed no
    approval (it has none to keep): then the current one."""
    return current if current["strict"] or submitted["required"] == 0 else submitted


@dataclass(frozen=True)
class Decision:
    """A standing decision as the rules read it."""

    approver: str
    decision: str
    eligible: bool
    comment: str = ""


def approvals_missing(*, rule: dict, decisions: list[Decision], skipped: bool) -> dict | None:
    """What the release still lacks, or None when it may go: {"required", "given",
    "missing", "approved_by", "rejected_by"}. A rejection by an eligible approver
    holds it whatever the count; approvals by people who may not approve (no longer
    eligible under a strict rule) do not count."""
    if skipped or rule["required"] == 0:
        return None
    approved = [d.approver for d in decisions if d.decision == "approve" and d.eligible]
    rejected = [{"by": d.approver, "comment": d.comment} for d in decisions
                if d.decision == "reject" and d.eligible]
    if len(approved) >= rule["required"] and not rejected:
        return None
    return {"required": rule["required"], "given": len(approved),
            "missing": max(rule["required"] - len(approved), 0), "approved_by": approved,
            "rejected_by": rejected}


def approver_refusal(*, is_author: bool, is_member: bool, is_owner: bool, groups: set[str],
                     rule: dict) -> str | None:
    """Why this person may not decide on the release, or None: never an author of
    its content (who asked, published or edited it), never someone outside the
    environment's tenant (a Django group spans tenants), else an owner where the
    rule lets owners approve or a member of a group it names."""
    if is_author:
        return "the author of a change cannot approve or reject it"
    if not is_member:
        return "only members of the environment's tenant may decide on its releases"
    if rule["owners_approve"] and is_owner:
        return None
    if groups & set(rule["groups"]):
        return None
    who = (["the environment's owners"] if rule["owners_approve"] else []) + [
        f"members of {g}" for g in rule["groups"]]
    return "only " + (" or ".join(who) or "nobody") + " may decide on releases here"


# --- windows -----------------------------------------------------------------------------


def zone(name: str) -> ZoneInfo | None:
    """The IANA timezone `name`, or None when there is none by that name."""
    if not isinstance(name, str) or not name or len(name) > 64 or name.startswith(("/", ".")):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


@dataclass(frozen=True)
class Window:
    """A window as the rules read it (apps.governance.models.ReleaseWindow)."""

    name: str
    kind: str
    timezone: str
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    weekdays: tuple[int, ...] = ()
    start_time: time | None = None
    end_time: time | None = None


def _local(day: date, at: time, tz: ZoneInfo) -> datetime:
    return datetime.combine(day, at, tzinfo=tz)


def occurrences(window: Window, start: datetime, end: datetime) -> list[tuple]:
    """The window's spans [from, to) that meet [start, end), in time order."""
    if window.start_time is None:
        if window.starts_at < end and window.ends_at > start:
            return [(window.starts_at, window.ends_at)]
        return []
    tz = zone(window.timezone)
    spans = []
    day = start.astimezone(tz).date() - timedelta(days=1)
    while _local(day, time(0), tz) < end:
        if day.weekday() in window.weekdays:
            begins = _local(day, window.start_time, tz)
            ends_day = day if window.end_time > window.start_time else day + timedelta(days=1)
            ends = _local(ends_day, window.end_time, tz)
            if begins < end and ends > start:
                spans.append((begins, ends))
        day += timedelta(days=1)
    return spans


def window_open_at(window: Window, at: datetime) -> tuple | None:
    """The span of the window containing `at`, or None."""
    for begins, ends in occurrences(window, at - timedelta(seconds=1), at + timedelta(seconds=1)):
        if begins <= at < ends:
            return begins, ends
    return None


def windows_overlap(a: Window, b: Window, now: datetime) -> tuple | None:
    """The first span where both windows are open (from now on), or None: one-off
    windows within their own spans, weekly ones over a year of their occurrences."""
    start = now
    end = now + OVERLAP_HORIZON
    for w in (a, b):
        if w.start_time is None:
            start, end = max(start, w.starts_at), min(end, w.ends_at)
    if start >= end:
        return None
    first, second = occurrences(a, start, end), occurrences(b, start, end)
    i = j = 0
    while i < len(first) and j < len(second):
        begins = max(first[i][0], second[j][0], start)
        ends = min(first[i][1], second[j][1])
        if begins < ends:
            return begins, ends
        if first[i][1] <= second[j][1]:
            i += 1
        else:
            j += 1
    return None


def release_hold(*, freezes: list[Window], allows: list[Window], at: datetime,
                 overridden: bool) -> dict | None:
    """Why nothing may start at `at`, or None: a freeze in force, or, when the
    environment has allow windows, being outside all of them. An owner's emergency
    override in force lifts both."""
    if overridden:
        return None
    for window in freezes:
        span = window_open_at(window, at)
        if span is not None:
            return {"reason": "freeze", "window": window.name, "until": span[1].isoformat()}
    if allows and not any(window_open_at(w, at) for w in allows):
        upcoming = [occurrences(w, at, at + timedelta(days=8))[:1] for w in allows]
        opens = min((spans[0][0] for spans in upcoming if spans), default=None)
        return {"reason": "outside_allow_windows", "windows": sorted(w.name for w in allows),
                "until": opens.isoformat() if opens else None}
    return None


def describe_hold(hold: dict) -> str:
    if hold["reason"] == "freeze":
        return f"the freeze {hold['window']!r} is in force until {hold['until']}"
    opens = f"; the next opens at {hold['until']}" if hold.get("until") else ""
    return f"outside the allow windows ({', '.join(hold['windows'])}){opens}"


# --- scheduled releases ------------------------------------------------------------------


def schedule_changed(*, expected_active: int | None, active: int | None,
                     expected_version: int, version: int, state: str) -> dict | None:
    """Why a scheduled release must not start (compare-and-set): the environment's
    active snapshot or the release changed since it was scheduled; None when not.
    Snapshot numbers, not ids."""
    if state != "open":
        return {"reason": "release_closed", "state": state,
                "message": f"the release is {state} now"}
    if version != expected_version:
        return {"reason": "release_changed", "version": version,
                "expected_version": expected_version,
                "message": f"the release changed since scheduling (version {version}, "
                           f"scheduled at {expected_version})"}
    if active != expected_active:
        def name(n):
            return f"#{n}" if n is not None else "nothing"
        return {"reason": "active_changed", "active": active, "expected_active": expected_active,
                "message": f"the active snapshot changed since scheduling ({name(active)} now, "
                           f"{name(expected_active)} then): newer work is not overwritten"}
    return None
