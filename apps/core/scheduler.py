"""Whether the scheduler runs. Celery beat (embedded mode: the periodic loop) records
when it sends the periodic work; once it has not for two reconcile intervals, the
dashboard, every running rollout's reason and /metrics say that the work waits for
it: timed waves, bakes, retention and scheduled releases do not move without it."""

import logging
import time
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from apps.core.models import SchedulerBeat

logger = logging.getLogger(__name__)

RECORDED_EVERY_S = 5.0
_recorded_at = 0.0  # (monotonic) in this process


def late_after() -> timedelta:
    """Two of the intervals of the rollouts' reconcile, the periodic work that moves
    running rollouts."""
    return timedelta(seconds=2 * settings.CELERY_BEAT_SCHEDULE["reconcile-rollouts"]["schedule"])


def scheduler_seen() -> None:
    """Record that the scheduler sends its work now (at most every RECORDED_EVERY_S
    per process; a database down is logged and tried again at the next)."""
    global _recorded_at
    now = time.monotonic()
    if now - _recorded_at < RECORDED_EVERY_S:
        return
    _recorded_at = now
    try:
        SchedulerBeat.objects.update_or_create(pk=1, defaults={"seen_at": timezone.now()})
    except DatabaseError:
        logger.warning("database unavailable; the scheduler's run not recorded", exc_info=True)
        _recorded_at = 0.0


def last_seen() -> datetime | None:
    return SchedulerBeat.objects.filter(pk=1).values_list("seen_at", flat=True).first()


def is_late(seen: datetime | None) -> bool:
    """Whether a scheduler last seen at `seen` is late: longer ago than `late_after()`
    (one never seen is not: a new installation says nothing)."""
    return seen is not None and timezone.now() - seen > late_after()


def scheduler_late_since() -> datetime | None:
    """When the scheduler was last seen, while it is late; else None."""
    seen = last_seen()
    return seen if is_late(seen) else None
