"""A rollout's targets and the pins they hold, written set-based: storing the
targets, activating a wave and releasing pins each take a constant number of
queries, however many targets (INSERT … SELECT and UPDATE with subqueries; no id
list round-trips through Python). Inner steps of apps.rollouts.services, which
holds the locks and writes the audit events."""

from django.db.models import Case, F, OuterRef, Subquery, Value, When
from django.utils import timezone

from apps.core.bulk import insert_from_select
from apps.fleet.models import Agent
from apps.fleet.selectors import desired_snapshot_id
from apps.fleet.services import pins_set
from apps.rollouts.models import Rollout, RolloutTarget

TARGET_FIELDS = ["rollout_id", "agent_id", "wave", "previous_snapshot_id", "state",
                 "generation"]


def _wave_of(assignment: list[tuple]):
    """The wave of each agent as a CASE over the agents' ids, the largest wave its
    default (the fewest ids written into the statement)."""
    by_wave: dict[int, list[int]] = {}
    for agent, wave in assignment:
        by_wave.setdefault(wave, []).append(agent.pk)
    largest = max(by_wave, key=lambda wave: len(by_wave[wave]))
    whens = [When(pk__among=ids, then=Value(wave)) for wave, ids in sorted(by_wave.items())
             if wave != largest]
    return Case(*whens, default=Value(largest)) if whens else Value(largest)


def targets_store(rollout: Rollout, assignment: list[tuple]) -> None:
    """Write the rollout's targets [(agent, wave)] in one INSERT … SELECT, each with
    what its agent desires now, then freeze every agent on it with the rollout's pin
    in one UPDATE. The targets' generation is the agent's after that freeze (which
    bumps it once); a wave's activation records it again."""
    chosen = Agent.objects.filter(pk__among=[agent.pk for agent, _ in assignment]).order_by()
    rows = chosen.values_list(
        Value(rollout.pk), "pk", _wave_of(assignment), desired_snapshot_id(),
        Value(RolloutTarget.State.PENDING), F("generation") + 1)
    insert_from_select(RolloutTarget, TARGET_FIELDS, rows)
    # Unordered: a model's default ordering would join its related tables in.
    frozen_on = (RolloutTarget.objects.filter(rollout=rollout, agent_id=OuterRef("pk"))
                 .order_by())
    pins_set(RolloutTarget.objects.filter(rollout=rollout).values("agent_id"),
             snapshot=Subquery(frozen_on.values("previous_snapshot_id")[:1]),
             rollout=rollout)


def wave_activate(rollout: Rollout, wave: int) -> int:
    """Move the pins of the wave's pending targets to the rollout's snapshot and
    mark them activated, with the agents' generation now; returns how many."""
    pending = RolloutTarget.objects.filter(rollout=rollout, wave=wave,
                                           state=RolloutTarget.State.PENDING)
    pins_set(pending.values("agent_id"), snapshot=rollout.snapshot, rollout=rollout)
    return pending.update(
        state=RolloutTarget.State.ACTIVATED, activated_at=timezone.now(),
        generation=Subquery(Agent.objects.filter(pk=OuterRef("agent_id")).order_by()
                            .values("generation")[:1]))


def pins_release(rollout: Rollout, targets, follow) -> int:
    """Release the pins `rollout` holds on these targets' agents and mark the targets
    released; returns how many pins. Manual agents follow their target once
    released: an activated one is moved to `follow` (what replaced the rollout's
    snapshot, or it)."""
    held = targets.filter(agent__pin_rollout=rollout).values("agent_id")
    if follow is not None:
        activated = targets.filter(state=RolloutTarget.State.ACTIVATED).values("agent_id")
        Agent.objects.filter(pk__in=held, mode=Agent.Mode.MANUAL).filter(
            pk__in=activated).update(target_snapshot=follow)
    released = pins_set(held, snapshot=None)
    targets.update(state=RolloutTarget.State.RELEASED)
    return released
