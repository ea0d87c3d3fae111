"""Reads of the audit log, including what is waiting to roll out."""

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.diff import diff_files
from apps.snapshots.selectors import latest_ready_snapshot, snapshot_preview

# The changes a snapshot is rendered from; others (owners, agents, activation)
# do not wait for a rollout.
INPUT_ACTIONS = (
    "environment.create", "environment.update",
    "template.create", "template.update", "template.delete",
    "fallback.create", "fallback.update", "fallback.delete",
)


def pending_changes(environment: Environment) -> dict:
    """Audit events the latest ready snapshot does not contain, and the diff of
    rendering now against it. Delimited by audit id, never by time (seed 000):
    the snapshot records the newest event when its inputs were captured."""
    latest = latest_ready_snapshot(environment)
    events = AuditEvent.objects.filter(environment=environment, action__in=INPUT_ACTIONS)
    if latest is not None and latest.inputs_audit_id is not None:
        events = events.filter(id__gt=latest.inputs_audit_id)
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
