"""A wave's limits, set-based (docs/rollouts.md, "Max in flight and failure stops"):
with `max_in_flight` only that many of a wave's targets get the rollout's snapshot
pinned at a time, more as they report (reconcile tops the wave up); with
`max_failures` the wave stops (the rollout pauses) once that many of its targets
reported a failure. Each step is a constant number of queries however many
targets; a wave without limits costs nothing more than before."""

from django.db.models import Exists, OuterRef, Subquery
from django.utils import timezone

from apps.fleet.models import Agent, Deployment
from apps.fleet.services import pins_set
from apps.rollouts import rules
from apps.rollouts.models import Rollout, RolloutTarget
from apps.rollouts.targets import wave_activate


def _limit(rollout: Rollout, wave: int, name: str) -> int | None:
    return rollout.waves[wave].get(name)


def _activate_first(rollout: Rollout, wave: int, room: int) -> int:
    """Activate the first `room` pending targets of the wave (by agent name, as the
    waves were filled): their pins move to the rollout's snapshot. Two UPDATEs over
    a LIMITed subquery."""
    first = (RolloutTarget.objects.filter(rollout=rollout, wave=wave,
                                          state=RolloutTarget.State.PENDING)
             .order_by("agent__name", "agent_id").values("pk")[:room])
    chosen = RolloutTarget.objects.filter(pk__in=Subquery(first)).order_by()
    pins_set(chosen.values("agent_id"), snapshot=rollout.snapshot, rollout=rollout)
    # The same rows again: they are still the first pending ones.
    return chosen.update(
        state=RolloutTarget.State.ACTIVATED, activated_at=timezone.now(),
        generation=Subquery(Agent.objects.filter(pk=OuterRef("agent_id")).order_by()
                            .values("generation")[:1]))


def wave_open(rollout: Rollout, wave: int) -> int:
    """Activate a wave as it opens: all of it, or its first max_in_flight targets
    (by agent name)."""
    limit = _limit(rollout, wave, "max_in_flight")
    return wave_activate(rollout, wave) if not limit else _activate_first(rollout, wave, limit)


def _reported(rollout: Rollout):
    """A report of the rollout's snapshot by the target's agent after its activation."""
    return Deployment.objects.filter(agent_id=OuterRef("agent_id"), snapshot=rollout.snapshot,
                                     reported_at__gt=OuterRef("activated_at"))


def in_flight(rollout: Rollout, wave: int) -> int:
    """Activated targets of the wave that have not reported yet (one query)."""
    return (RolloutTarget.objects.filter(rollout=rollout, wave=wave,
                                         state=RolloutTarget.State.ACTIVATED,
                                         agent__decommissioned_at__isnull=True)
            .exclude(Exists(_reported(rollout))).count())


def wave_top_up(rollout: Rollout) -> int:
    """Activate as many more pending targets of the current wave as have reported
    since, up to max_in_flight in flight; returns how many. Rollout locked."""
    limit = _limit(rollout, rollout.current_wave, "max_in_flight")
    if not limit:
        return 0
    room = limit - in_flight(rollout, rollout.current_wave)
    return _activate_first(rollout, rollout.current_wave, room) if room > 0 else 0


def wave_failures(rollout: Rollout, wave: int) -> int:
    """Activated targets of the wave that reported a failure of the snapshot after
    activation (one counting query)."""
    failed = _reported(rollout).filter(state__in=[Deployment.State.WARNING,
                                                  Deployment.State.FAILED])
    return RolloutTarget.objects.filter(rollout=rollout, wave=wave,
                                        state=RolloutTarget.State.ACTIVATED
                                        ).filter(Exists(failed)).count()


def wave_stop_reason(rollout: Rollout) -> str | None:
    """Why the current wave stops (it reached its max_failures), or None."""
    limit = _limit(rollout, rollout.current_wave, "max_failures")
    if not limit:
        return None
    failed = wave_failures(rollout, rollout.current_wave)
    if failed < limit:
        return None
    return (f"{rules.wave_name(rollout.current_wave)} stopped after {failed} failure(s) "
            f"(max_failures {limit})")

