from django.db import models


class SchedulerBeat(models.Model):
    """When the scheduler (Celery beat; embedded mode's periodic loop) last sent the
    periodic work: one row (apps.core.scheduler)."""

    seen_at = models.DateTimeField()

    def __str__(self):
        return f"scheduler seen at {self.seen_at:%Y-%m-%d %H:%M:%S}"
