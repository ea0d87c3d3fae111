"""The fleet's rules, pure: no database, no I/O. They read agents' attributes (an
Agent row or anything shaped like one) and say what follows.

- `labels_problem`: what is wrong with an agent's labels; `labels_field`: where.
- `is_held`: an agent held by a pin follows it, whatever is activated or pushed;
  `held_by` says by whom, `holder_text` and `held_refusal` name the holder and
  the action that frees the agent.
- `refuses`: an agent never goes back below the snapshot it applied.
- `check_generation`, `pin_target_refusal`, `going_back_refusal`: the checks of
  an operator's change to one agent.
- `push_refusal`: why a push of a snapshot to some agents cannot happen.
- `report_changes`: what an agent's report changes on the agent; `health_text`
  says what its health probe found, in words.
- `drift_refusal`, `drift_changes`: whether a drift report is about what the agent
  applied, and what it changes on the agent (nothing for an identical repeat).
- `poll_debt_sweepable`, `poll_debts_need_sweep`: when a committed change's poll
  invalidation may be settled (its cache keys dropped for good, its row removed);
  `debt_generations`, `cached_answer_reflects`: which cached answers a debt still
  trusts (those computed at the generation the change reached, or later).
- `decommissioned_refusal`: a decommissioned agent takes no further change.
- `strangers_refusal`: a plan (push, rollout, release) names only agents of its
  own environment.
- `enroll_command`: the command line that enrolls and runs an agent.
- `if_none_match_matches`: whether a poll's If-None-Match names the current ETag.
"""

import shlex

from django.utils.http import parse_etags

from apps.core.errors import ApplicationError, Conflict, ValidationFailed

SUCCEEDED = "succeeded"
# A change's poll invalidation (PollInvalidation) is settled no sooner than this
# after a sweep first saw it committed: a poll that read the database before the
# change committed stores its stale answer within its request (the cache client's
# timeout, REDIS_TIMEOUT_S <= 5 s, included), so the settling delete comes after it.
POLL_DEBT_GRACE_S = 10.0
# How often a web process re-reads the token keys whose cached answers it must not
# trust (the bound on a stale answer after a commit, on top of the request).
POLL_DEBT_REFRESH_S = 1.0
AUTO_PULL = "auto_pull"
MAX_LABELS = 32


def labels_problem(labels) -> str | None:
    """Why `labels` are not an agent's labels, or None."""
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
        isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 63 and len(v) <= 255
        for k, v in labels.items()
    ):
        return (f"labels must be an object of at most {MAX_LABELS} string keys (1-63 "
                "characters) to string values (at most 255).")
    return None


def labels_field(labels) -> str:
    """The field a labels problem names: `labels.<key>` (long keys cut to 40
    characters, an empty one as `labels.""`) for the first entry at fault, or
    `labels` when the whole is (not an object, too many keys)."""
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        return "labels"
    for key, value in labels.items():
        if not (isinstance(key, str) and isinstance(value, str) and 0 < len(key) <= 63
                and len(value) <= 255):
            shown = str(key)
            shown = '""' if not shown else shown if len(shown) <= 40 else shown[:40] + "…"
            return f"labels.{shown}"
    return "labels"


def is_held(agent) -> bool:
    """Held by a pin: an operator's (on a snapshot) or a rollout's (which may hold a
    target at "nothing yet", so its snapshot can be None)."""
    return agent.pinned_snapshot_id is not None or agent.pin_rollout_id is not None


# Which snapshot an agent desires (desired_source).
PINNED, TARGET, ACTIVE = "pinned", "target", "active"


def desired_source(agent) -> str:
    """Which snapshot `agent` (a model or a row of its columns) desires: its pin if
    held (PINNED), else a manual agent's target (TARGET), else the environment's
    active snapshot (ACTIVE)."""
    if is_held(agent):
        return PINNED
    return TARGET if agent.mode == "manual" else ACTIVE


def held_by(agent) -> dict | None:
    """Who holds the agent: {"kind": "rollout", "rollout": id}, {"kind":
    "operator", "by": username or None}, or None when it is not held."""
    if agent.pin_rollout_id is not None:
        return {"kind": "rollout", "rollout": agent.pin_rollout_id}
    if agent.pinned_snapshot_id is not None:
        by = agent.pinned_by.username if agent.pinned_by_id is not None else None
        return {"kind": "operator", "by": by}
    return None


def holder_text(agent) -> str:
    """'<name> is held by rollout 7; release that rollout's pins (...) or roll it
    back': who holds the agent and the action that frees it (agent held)."""
    holder = held_by(agent)
    if holder is not None and holder["kind"] == "rollout":
        rollout = holder["rollout"]
        return (f"{agent.name} is held by rollout {rollout}; release that rollout's pins "
                f"(POST /api/v1/rollouts/{rollout}/release-pins) or roll it back")
    by = f" ({holder['by']})" if holder and holder["by"] else ""
    return (f"{agent.name} is held by an operator{by}; release its pin "
            f"(POST /api/v1/agents/{agent.pk}/pin/release)")


def held_refusal(agents: list, doing: str) -> Conflict | None:
    """The refusal (409 agent_pinned) of `doing` to agents of which some are held,
    naming each holder and what frees it; None when none is held."""
    held = [a for a in agents if is_held(a)]
    if not held:
        return None
    return Conflict(f"Cannot {doing}: " + "; ".join(holder_text(a) for a in held[:20]) + ".",
                    code="agent_pinned",
                    details=[{"agent": a.pk, "name": a.name, "held_by": held_by(a)}
                             for a in held[:100]])


def refuses(agent, number: int | None) -> bool:
    """Whether the agent would refuse snapshot `number`: it never goes back below
    what it applied (nothing, None, counts as going back for an agent that has
    applied something)."""
    return agent.applied_number is not None and (number is None
                                                 or number < agent.applied_number)


def check_generation(agent, expected_generation: int) -> None:
    """Compare and set: refuse (409 stale) when the agent changed since it was read."""
    if agent.generation != expected_generation:
        raise Conflict(f"{agent.name} changed since you loaded it (generation "
                       f"{agent.generation}, not {expected_generation}).", code="stale",
                       details=[{"agent": agent.pk, "generation": agent.generation}])


def pin_target_refusal(agent, snapshot) -> ApplicationError | None:
    """Why an operator may not pin `agent` to `snapshot` at all, or None: a
    rollout's pin is released through its rollout; only a ready snapshot of the
    agent's own environment can be pinned."""
    if agent.pin_rollout_id is not None:
        return held_refusal([agent], "pin it")
    if snapshot.environment_id != agent.environment_id or not snapshot.is_ready:
        return ValidationFailed(f"Snapshot {snapshot.number} is not a ready snapshot of "
                                "the agent's environment.")
    return None


def decommissioned_refusal(agents: list, doing: str) -> Conflict | None:
    """The refusal (409 decommissioned) of `doing` to agents of which some are
    decommissioned: they keep their history and take no change."""
    gone = [a for a in agents if a.decommissioned_at is not None]
    if not gone:
        return None
    return Conflict(
        f"Cannot {doing}: " + ", ".join(a.name for a in gone[:20])
        + (" is" if len(gone) == 1 else " are") + " decommissioned (since "
        + ", ".join(f"{a.decommissioned_at:%Y-%m-%d %H:%M}Z" for a in gone[:20])
        + "); enroll a new agent instead.", code="decommissioned",
        details=[{"agent": a.pk, "name": a.name, "decommissioned_at": a.decommissioned_at}
                 for a in gone[:100]])


ENROLL_NAME_PLACEHOLDER = "<agent-name>"
ENROLL_TARGET_PLACEHOLDER = "/etc/<service>/bellwether"


def strangers_refusal(environment_name: str,
                      strangers: dict[str, list[int]]) -> ValidationFailed | None:
    """400 unknown_agents naming each field whose ids are no agents of the
    environment (another environment's, or none), and those ids; None when none."""
    named = {field: sorted(ids) for field, ids in strangers.items() if ids}
    if not named:
        return None
    return ValidationFailed(
        "; ".join(f"{field}: {ids[:20]} are no agents of {environment_name}"
                  for field, ids in named.items()) + ".", code="unknown_agents",
        details=[{"field": field, "message": f"no agents of {environment_name}",
                  "agents": ids[:100]} for field, ids in named.items()])


def enroll_command(*, server: str, enrollment_token: str, name: str = "",
                   target_dir: str = "") -> str:
    """The command an operator runs on a host to enroll an agent with this
    enrollment token and keep it running (the options of `bellwether-agent
    --help`); placeholders in angle brackets where the name or target is not known."""
    parts = ["bellwether-agent", "--server", server.rstrip("/"),
             "--enrollment-token", enrollment_token,
             "--name", name or ENROLL_NAME_PLACEHOLDER,
             "--target-dir", target_dir or ENROLL_TARGET_PLACEHOLDER]
    return " ".join(shlex.quote(p) for p in parts)


def going_back_refusal(agent, snapshot) -> ApplicationError | None:
    """The refusal of moving `agent` to an older snapshot than it applied."""
    if refuses(agent, snapshot.number):
        return Conflict(f"{agent.name} has #{agent.applied_number}; it refuses lower "
                        "numbers. Roll back instead.", code="rollback_required")
    return None


def _going_back(agent, snapshot, active) -> dict | None:
    """Why pushing `snapshot` to this one agent would move it backwards, or to a
    snapshot it does not follow; None when it may have it."""
    if refuses(agent, snapshot.number):
        return {"agent": agent.pk, "name": agent.name, "newer": False,
                "reason": f"has #{agent.applied_number} active; it refuses lower numbers"}
    if agent.mode == AUTO_PULL and (active is None or active.pk != snapshot.pk):
        older = active is not None and snapshot.number < active.number
        return {"agent": agent.pk, "name": agent.name, "newer": not older, "reason": (
            f"follows the active #{active.number}; it would switch back" if older
            else "follows the active snapshot; activate this one first")}
    return None


def push_refusal(agents: list, snapshot, active) -> Conflict | None:
    """The refusal of pushing `snapshot` to `agents` while `active` is the
    environment's active snapshot, or None when the push may go ahead."""
    disabled = [a.name for a in agents if not a.enabled]
    if disabled:
        return Conflict(f"Agents {', '.join(disabled)} are disabled; enable them to push.",
                        code="agent_disabled")
    held = held_refusal(agents, f"push #{snapshot.number}")
    if held is not None:
        return held
    refusals = [r for r in (_going_back(a, snapshot, active) for a in agents) if r]
    if not refusals:
        return None
    # Going back needs a rollback; a newer snapshot merely needs activating.
    newer = [r.pop("newer") for r in refusals]
    code = "not_active" if all(newer) else "rollback_required"
    return Conflict(
        f"Cannot push #{snapshot.number} to {len(refusals)} agent(s); "
        + ("activate it first, or switch them to manual." if code == "not_active"
           else "roll back, or switch them to manual."),
        code=code, details=refusals)


def report_changes(agent, *, number: int, checksum: str, status: str, message: str,
                   now, health: dict | None = None) -> dict:
    """The agent's fields a report sets. A report about an older snapshot than the
    one the agent applied arrives late: it is history (its deployment row), and
    changes nothing on the agent. Otherwise a success moves the applied snapshot
    forward and lifts a block on that number or older; a failure or warning
    blocks its snapshot."""
    if agent.applied_number is not None and number < agent.applied_number:
        return {}
    changes = {"last_status": status, "last_message": message, "last_report_at": now,
               "last_health": health}
    if status != SUCCEEDED:
        changes.update(blocked_number=number, blocked_checksum=checksum)
        return changes
    changes.update(applied_number=number, applied_checksum=checksum)
    if getattr(agent, "drift_seen_at", None) is not None:
        # The apply wrote the snapshot's files again: nothing is hand-edited any more.
        changes.update(drift=[], drift_seen_at=None, drift_restored=False)
    if agent.blocked_number is not None and number >= agent.blocked_number:
        changes.update(blocked_number=None, blocked_checksum="")
    return changes


def health_text(health: dict | None) -> str | None:
    """A report's health probe in words, "failed after 3 attempts (url) — HTTP 502",
    or None when no probe ran."""
    if not health:
        return None
    attempts = health.get("attempts", 0)
    tried = f"after {attempts} attempt{'' if attempts == 1 else 's'} ({health.get('probe')})"
    if health.get("ok"):
        return f"healthy {tried}"
    output = health.get("output") or ""
    return f"failed {tried}" + (f" — {output}" if output else "")
def drift_refusal(agent, *, number: int, checksum: str) -> Conflict | None:
    """The refusal (409 not_applied) of a drift report about another snapshot than
    the one the agent last reported applied: drift is only ever against that one."""
    if (agent.applied_number, agent.applied_checksum) == (number, checksum):
        return None
    applied = ("nothing" if agent.applied_number is None
               else f"#{agent.applied_number} ({agent.applied_checksum})")
    return Conflict(f"Drift of #{number} ({checksum}) is not recorded: {agent.name} last "
                    f"reported {applied} applied.", code="not_applied",
                    details=[{"field": "snapshot", "applied": agent.applied_number}])


def drift_repeated_path(paths) -> int | None:
    """The index of the first path a drift report names a second time, or None."""
    seen = set()
    for index, path in enumerate(paths):
        if path in seen:
            return index
        seen.add(path)
    return None


def drift_unknown_paths(files: list, managed: set) -> list[dict]:
    """The envelope's details for each drifted path that is not a file of the
    applied snapshot (`managed`: its files' and fallback files' paths), named
    files[i].path: an agent reports drift only of files it wrote."""
    return [{"field": f"files[{index}].path",
             "message": f"{entry['path']!r} is not a file of the applied snapshot."}
            for index, entry in enumerate(files) if entry["path"] not in managed]


def drift_changes(agent, *, files: list, restored: bool, now) -> dict:
    """The agent's fields a drift report sets: its drifted files and whether it
    restored them, since `now` when the drift starts or changes; an empty list
    clears it. An identical repeat changes nothing ({})."""
    if not files:
        if agent.drift_seen_at is None:
            return {}
        return {"drift": [], "drift_seen_at": None, "drift_restored": False}
    if agent.drift_seen_at is not None and (agent.drift, agent.drift_restored) == (
            files, restored):
        return {}
    return {"drift": files, "drift_seen_at": now, "drift_restored": restored}


def poll_debt_sweepable(seen_at, now) -> bool:
    """Whether an invalidation first seen committed at `seen_at` is past its grace
    period at `now` (its keys may be dropped for good and the row removed)."""
    return seen_at is not None and (now - seen_at).total_seconds() >= POLL_DEBT_GRACE_S


def poll_debts_need_sweep(seen_ats, now) -> bool:
    """Whether a sweep has work: an invalidation not yet seen, or one past its grace."""
    return any(s is None or poll_debt_sweepable(s, now) for s in seen_ats)


def debt_generations(rows) -> dict[str, int | None]:
    """Token key -> the generation a cached answer must have been computed at (or
    after) to be trusted despite the unsettled invalidations `rows` ((token_keys,
    generations) pairs); None for a key some invalidation names without one: no
    cached answer of it is trusted until that row is settled."""
    required: dict[str, int | None] = {}
    for keys, generations in rows:
        for key in keys:
            needed = None if generations is None else generations.get(key)
            known = required.get(key, needed)
            required[key] = None if known is None or needed is None else max(known, needed)
    return required


class IndebtedKeys(frozenset):
    """The token keys of the unsettled poll invalidations, with `generations`: for
    each key whose every invalidation named one, the generation a cached answer
    must have been computed at (or after) to be trusted (debt_generations)."""

    def __new__(cls, required: dict[str, int | None] | None = None):
        keys = super().__new__(cls, required or ())
        keys.generations = {k: g for k, g in (required or {}).items() if g is not None}
        return keys


def cached_answer_reflects(required: int | None, generation: int | None) -> bool:
    """Whether a cached poll answer computed at `generation` reflects every change
    of a debt requiring `required` (None: it never does)."""
    return required is not None and generation is not None and generation >= required


def if_none_match_matches(header: str, etag: str) -> bool:
    """RFC 9110 13.1.2 as Django's condition() decides it: a list of entity tags or
    `*`, compared weakly (W/ ignored); a malformed header matches nothing."""
    etags = parse_etags(header)
    if etags == ["*"]:
        return True
    return etag.removeprefix("W/") in (tag.removeprefix("W/") for tag in etags)
