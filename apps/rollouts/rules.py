"""The rules of staged rollouts, pure: no database, no I/O.

- `plan_waves` turns canaries and wave specs (percent or count) into wave sizes
  with their gates and bake times; `assign_waves` puts agents into them.
- `WaveEvidence` is what the targets of a wave have shown; `settled` and
  `blockers` say whether the wave may advance and what holds it.
- `is_canary` says whether an agent is a canary by id or labels;
  `canaries_chosen` splits a rollout's targets into its canaries and the others.
- `strategy_problems` checks a named strategy's definition, field by field;
  `rollout_options` merges a strategy with the fields a request set itself.
- `nothing_to_roll_out` says when a rollout could never finish: every target
  already runs the snapshot.
- `shown_reason` is a rollout's reason as shown, the scheduler's absence first;
  `failure_reason` why an automatic rollback happened; `wave_name` a wave's name.
"""

import math
from dataclasses import dataclass, field

from apps.core.errors import ValidationFailed

AUTO = "auto"


def is_canary(agent, *, ids: set, labels: dict | None) -> bool:
    """Named by id, or carrying every one of the canary labels."""
    if agent.pk in ids:
        return True
    return bool(labels) and all(agent.labels.get(k) == v for k, v in labels.items())


def canaries_chosen(agents: list, ids: list[int] | None, labels: dict | None,
                    size: int | None = None) -> tuple:
    """(canaries, others): the others ordered by name, as their waves take them.
    Without ids or labels, the first `size` agents by name are the canaries."""
    ids = set(ids or [])
    strangers = sorted(ids - {a.pk for a in agents})
    if strangers:
        raise ValidationFailed(f"Canaries {strangers[:20]} are not among the targets.",
                               code="canary_not_target", details=[{
                                   "field": "canary_agents", "message": "not among the targets",
                                   "agents": strangers[:100]}])
    canaries = [a for a in agents if is_canary(a, ids=ids, labels=labels)]
    if not ids and not labels and size:
        canaries = sorted(agents, key=lambda a: (a.name, a.pk))[:size]
    if not canaries:
        raise ValidationFailed("The canary wave would be empty.", code="no_canaries")
    chosen = {a.pk for a in canaries}
    others = sorted((a for a in agents if a.pk not in chosen), key=lambda a: (a.name, a.pk))
    return canaries, others


def nothing_to_roll_out(number: int, checksum: str, targets: list) -> bool:
    """Whether every target already runs exactly this snapshot (its applied number
    and checksum are the snapshot's). Such a rollout could never finish: a wave is
    confirmed only on a report received after activation, and an agent never
    applies again what it already runs. (A snapshot that is already active with
    every follower in sync is the same case.) Same content under a new, higher
    number is something to roll out: agents apply it and report."""
    return bool(targets) and all(
        (t.applied_number, t.applied_checksum) == (number, checksum) for t in targets)


def wave_specs_problem(waves: list[dict]) -> str | None:
    """Why these wave specs cannot be planned, or None."""
    for wave in waves:
        if not (("percent" in wave and 0 < wave["percent"] <= 100)
                or ("count" in wave and wave["count"] >= 1)):
            return "Each wave needs a percent (1-100) or a count (>= 1)."
    return None


def wave_sizes(total: int, canaries: int, waves: list[dict]) -> list[int]:
    """Sizes of every wave, canaries first: each spec takes its percent of `total`
    (at least one) or its count; the last spec takes whatever remains, and
    anything left over after the specs forms one more wave."""
    remaining, sizes = total - canaries, [canaries]
    for index, wave in enumerate(waves):
        if remaining <= 0:
            break
        if index == len(waves) - 1:
            size = remaining
        elif "percent" in wave:
            size = max(1, math.ceil(total * wave["percent"] / 100))
        else:
            size = wave["count"]
        size = min(size, remaining)
        sizes.append(size)
        remaining -= size
    if remaining > 0:
        sizes.append(remaining)
    return sizes


def plan_waves(*, total: int, canaries: int, waves: list[dict], canary_gate: str,
               bake_s: int) -> list[dict]:
    """[{size, gate, bake_s}] for every wave; wave 0 is the canaries'. A wave past
    the specs (the remainder) takes the last spec's gate and bake time."""
    sizes = wave_sizes(total, canaries, waves)
    plan = [{"size": canaries, "gate": canary_gate, "bake_s": bake_s}]
    for index, size in enumerate(sizes[1:]):
        spec = waves[min(index, len(waves) - 1)]
        plan.append({"size": size, "gate": spec.get("gate", AUTO),
                     "bake_s": spec.get("bake_s", 0),
                     **{k: spec[k] for k in WAVE_LIMITS if spec.get(k)}})
    return plan


# A wave's limits: how many of its agents may be applying at once (the others wait
# unpinned-to-new until some report), and how many failures stop (pause) it.
WAVE_LIMITS = ("max_in_flight", "max_failures")


def assign_waves(canaries: list, others: list, plan: list[dict]) -> list[tuple]:
    """(agent, wave) for every target: canaries in wave 0, the others in order
    filling the later waves by their planned sizes."""
    assignment, offset = [(a, 0) for a in canaries], 0
    for wave, spec in enumerate(plan[1:], start=1):
        assignment += [(a, wave) for a in others[offset:offset + spec["size"]]]
        offset += spec["size"]
    return assignment


@dataclass
class WaveEvidence:
    """The targets of one wave by what they have shown, by name."""

    acknowledged: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    released: list = field(default_factory=list)
    changed: list = field(default_factory=list)
    # Gone for good: they neither block nor acknowledge; a wave of only these passes.
    decommissioned: list = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every target acknowledged: what a manual confirm needs."""
        return bool(self.acknowledged or self.decommissioned) and not (
            self.failed or self.waiting or self.released or self.changed)

    @property
    def settled(self) -> bool:
        """Nothing left to wait for: what an automatic gate needs. Failures within
        the rollout's threshold are tolerated here (more roll the rollout back)."""
        return bool(self.acknowledged or self.decommissioned) and not (
            self.waiting or self.released or self.changed)

    def blockers(self, order: tuple = ("released", "failed", "changed", "waiting")
                 ) -> list[tuple[str, list]]:
        """(kind, names) of what keeps the wave from being complete, in `order`."""
        return [(kind, getattr(self, kind)) for kind in order if getattr(self, kind)]


# How a refused confirm names each kind of blocker.
BLOCKER_REASONS = {
    "released": "released by an operator",
    "failed": "reported a failure",
    "changed": "changed since activation",
    "waiting": "not yet acknowledged (fresh and exact)",
}


def describe(blockers: list[tuple[str, list]], labels: dict | None = None,
             shown: int = 20) -> str:
    """'label: a, b; label: c' naming at most `shown` agents per kind."""
    return "; ".join(f"{(labels or {}).get(kind, kind)}: {', '.join(names[:shown])}"
                     for kind, names in blockers)


def shown_reason(rollout, scheduler_late_since) -> str:
    """A rollout's reason as shown: a running rollout says first that it waits for
    the scheduler while that is late (apps.core.scheduler): its timed steps (bakes,
    timeouts) do not move without it."""
    if scheduler_late_since is None or rollout.state != "running":
        return rollout.reason
    waiting = f"waiting for the scheduler since {scheduler_late_since:%Y-%m-%d %H:%M:%S} UTC"
    return f"{waiting}; {rollout.reason}" if rollout.reason else waiting


FAILURE_SHOWN_CHARACTERS = 300


def failure_reason(threshold: int, failed: int, first: dict | None) -> str:
    """Why an automatic rollback happened, naming the first failed agent and what it
    said (apps.rollouts.selectors.failure_reports), the others counted."""
    reason = f"more than {threshold} target(s) failed"
    if first is None:
        return reason
    message = first["message"] or first["status"]
    if len(message) > FAILURE_SHOWN_CHARACTERS:
        message = message[:FAILURE_SHOWN_CHARACTERS - 1] + "…"
    reason += f"; {first['agent']}: {message}"
    return reason + (f" (and {failed - 1} more)" if failed > 1 else "")


def wave_name(index: int, waves: int | None = None) -> str:
    """A wave's name wherever one is shown (the panel, the audit log, reasons, the
    CLI): the canaries are wave 0, then wave 1, 2, ...; with `waves` (how many
    there are), "of" the last one's number."""
    name = "the canaries" if index == 0 else f"wave {index}"
    return f"{name} of {waves - 1}" if waves and index else name
