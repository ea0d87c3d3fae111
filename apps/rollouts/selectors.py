"""Reads about rollouts: acknowledgement evidence for a wave, freshness, listing."""

from dataclasses import dataclass, field
from datetime import timedelta

from django.db.models import F
from django.utils import timezone

from apps.rollouts.models import Rollout, RolloutTarget

FRESHNESS_INTERVALS = 3
FRESHNESS_MIN = timedelta(seconds=180)
FRESHNESS_MAX = timedelta(hours=1)


def freshness_window(rollout: Rollout) -> timedelta:
    """How recent an acknowledgement must be: 3 poll intervals, 180 s to 1 h."""
    interval = timedelta(seconds=rollout.environment.poll_interval_s)
    return min(FRESHNESS_MAX, max(FRESHNESS_MIN, FRESHNESS_INTERVALS * interval))


@dataclass
class WaveEvidence:
    acknowledged: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    waiting: list = field(default_factory=list)
    released: list = field(default_factory=list)
    changed: list = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return bool(self.acknowledged) and not (self.failed or self.waiting or self.released
                                                or self.changed)


def wave_evidence(rollout: Rollout, wave: int | None = None) -> WaveEvidence:
    """Who in `wave` has reported success for the exact snapshot number and checksum,
    strictly after activation and within the freshness window (seed 004)."""
    wave = rollout.current_wave if wave is None else wave
    snapshot = rollout.snapshot
    now = timezone.now()
    fresh_after = now - freshness_window(rollout)
    evidence = WaveEvidence()
    targets = (RolloutTarget.objects.filter(rollout=rollout, wave=wave)
               .select_related("agent").order_by("agent__name"))
    for target in targets:
        agent = target.agent
        name = agent.name
        if target.state == RolloutTarget.State.RELEASED:
            evidence.released.append(name)
        elif target.state != RolloutTarget.State.ACTIVATED:
            evidence.waiting.append(name)
        elif agent.generation != target.generation:
            evidence.changed.append(name)
        elif (agent.last_report_at is not None and agent.last_report_at > target.activated_at
              and (agent.blocked_number, agent.blocked_checksum) == (snapshot.number,
                                                                     snapshot.checksum)):
            evidence.failed.append(name)
        elif (agent.applied_number, agent.applied_checksum) == (snapshot.number,
                                                                snapshot.checksum) and (
                agent.last_status == "succeeded" and agent.last_report_at is not None
                and agent.last_report_at > target.activated_at
                and agent.last_report_at >= fresh_after):
            evidence.acknowledged.append(name)
        else:
            evidence.waiting.append(name)
    return evidence


def failures(rollout: Rollout) -> int:
    """Activated targets that reported a failure of this snapshot after activation
    (one counting query, however many targets)."""
    snapshot = rollout.snapshot
    return RolloutTarget.objects.filter(
        rollout=rollout, state=RolloutTarget.State.ACTIVATED,
        agent__blocked_number=snapshot.number, agent__blocked_checksum=snapshot.checksum,
        agent__last_report_at__gt=F("activated_at"),
    ).count()
