"""Governance rules, pure (no database): what a release's plan is, its digest, what
approvals count and what is missing, when a window is open, and whether two windows
overlap. Times are aware datetimes; windows' wall-clock times are read in their own
timezone through zoneinfo."""

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
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


def local_moment(wall: datetime, tz: ZoneInfo) -> datetime | None:
    """The moment (in UTC) a wall-clock time without an offset names in `tz`, or None
    when a DST change skips it (02:30 on a spring-forward night in Europe/Berlin). A
    time a DST change repeats is its first occurrence (RFC 5545, PEP 495 fold=0)."""
    first = wall.replace(tzinfo=tz, fold=0)
    if first.astimezone(UTC).astimezone(tz).replace(tzinfo=None) != wall.replace(fold=0):
        return None
    return first.astimezone(UTC)


def _local(day: date, at: time, tz: ZoneInfo) -> datetime:
    """`at` o'clock on `day` in `tz`, in UTC. As in RFC 5545: a time a DST change skips
    is read with the offset before the change (02:30 becomes 03:30 summer time), a
    time it repeats is its first occurrence."""
    return datetime.combine(day, at, tzinfo=tz).astimezone(UTC)


def _spans(window: Window, start: datetime) -> Iterator[tuple[datetime, datetime]]:
    """The window's spans [from, to) in UTC ending after `start`, in time order, for
    as long as the caller reads (a weekly window's never end)."""
    if window.start_time is None:
        if window.ends_at > start:
            yield window.starts_at.astimezone(UTC), window.ends_at.astimezone(UTC)
        return
    tz = zone(window.timezone)
    day = start.astimezone(tz).date() - timedelta(days=1)
    overnight = window.end_time <= window.start_time
    quiet = 0  # days without a span: a year of them means none will come
    while quiet < 366:
        quiet += 1
        if day.weekday() in window.weekdays:
            begins = _local(day, window.start_time, tz)
            ends = _local(day + timedelta(days=overnight), window.end_time, tz)
            # A span a DST change swallows whole (02:00-03:00 on the night it is
            # skipped) is empty that day.
            if begins < ends and ends > start:
                quiet = 0
                yield begins, ends
        day += timedelta(days=1)


def occurrences(window: Window, start: datetime, end: datetime) -> list[tuple]:
    """The window's spans [from, to), in UTC, that meet [start, end), in time order."""
    spans = []
    for begins, ends in _spans(window, start):
        if begins >= end:
            break
        spans.append((begins, ends))
    return spans


def window_open_at(window: Window, at: datetime) -> tuple | None:
    """The span of the window containing `at`, or None."""
    for begins, ends in occurrences(window, at - timedelta(seconds=1), at + timedelta(seconds=1)):
        if begins <= at < ends:
            return begins, ends
    return None


def _overlap_range(a: Window, b: Window, now: datetime) -> tuple[datetime, datetime]:
    """Where two windows can share a span, from now: within every one-off window's own
    span, exactly, however long or far ahead; two weekly windows over a year of
    occurrences (every DST change of both zones; past it the pattern repeats)."""
    start, end = now, None
    for w in (a, b):
        if w.start_time is None:
            start = max(start, w.starts_at)
            end = w.ends_at if end is None else min(end, w.ends_at)
    return start, (now + OVERLAP_HORIZON if end is None else end)


def windows_overlap(a: Window, b: Window, now: datetime) -> tuple | None:
    """The first span where both windows are open (from now on), or None. Spans are
    read lazily and the first shared one ends the search: a weekly window opens
    every week, so a weekly and a one-off window are decided within the first weeks
    of the one-off's span, whatever its length; two weekly ones within a year."""
    start, end = _overlap_range(a, b, now)
    if start >= end:
        return None
    first, second = _spans(a, start), _spans(b, start)
    x, y = next(first, None), next(second, None)
    while x is not None and y is not None and max(x[0], y[0]) < end:
        begins, ends = max(x[0], y[0], start), min(x[1], y[1], end)
        if begins < ends:
            return begins, ends
        if x[1] <= y[1]:
            x = next(first, None)
        else:
            y = next(second, None)
    return None


def shown_in(window: Window, moment: datetime) -> str:
    """A moment of the window as people read it: in the window's own timezone."""
    return moment.astimezone(zone(window.timezone) or UTC).isoformat()


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
            return {"reason": "freeze", "window": window.name,
                    "until": shown_in(window, span[1])}
    if allows and not any(window_open_at(w, at) for w in allows):
        upcoming = [(spans[0][0], w) for w in allows
                    for spans in [occurrences(w, at, at + timedelta(days=8))] if spans]
        opens = min(upcoming, key=lambda pair: pair[0], default=None)
        return {"reason": "outside_allow_windows", "windows": sorted(w.name for w in allows),
                "until": shown_in(opens[1], opens[0]) if opens else None}
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
