"""Reads of the audit log, including what is waiting to roll out."""

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.diff import diff_files
from apps.snapshots.selectors import latest_ready_snapshot, snapshot_preview

SNAPSHOT_ACTIONS = ("snapshot.create", "snapshot.rollback", "snapshot.invalid")


def pending_changes(environment: Environment) -> dict:
    """Audit events since the latest ready snapshot, and the diff of rendering now
    against it. Delimited by the snapshot's audit id, never by time (seed 000)."""
    latest = latest_ready_snapshot(environment)
    events = AuditEvent.objects.filter(environment=environment).exclude(
        action__in=SNAPSHOT_ACTIONS
    )
    if latest is not None:
        boundary = (
            AuditEvent.objects.filter(
                environment=environment,
                action__in=SNAPSHOT_ACTIONS,
                object_type="snapshots.snapshot",
                object_id=str(latest.pk),
            )
            .order_by("id")
            .values_list("id", flat=True)
            .first()
        )
        if boundary is not None:
            events = events.filter(id__gt=boundary)
    rendered = snapshot_preview(environment)
    return {
        "snapshot": latest,
        "events": list(events.select_related("actor").order_by("id")),
        "valid": rendered.is_valid,
        "errors": [p.as_dict() for p in rendered.problems],
        "files": diff_files(latest.files if latest else [], rendered.files)
        if rendered.is_valid
        else [],
    }


def audit_events_for(environment: Environment):
    return AuditEvent.objects.filter(environment=environment).order_by("-id")
