"""Reads of the audit log, including what is waiting to roll out."""

from django.db.models import Max

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.diff import diff_files
from apps.snapshots.models import Publication
from apps.snapshots.selectors import latest_ready_snapshot, snapshot_preview

# The changes a snapshot is rendered from; others (owners, agents, activation)
# do not wait for a rollout.
INPUT_ACTIONS = (
    "environment.create", "environment.update",
    "template.create", "template.update", "template.delete",
    "fallback.create", "fallback.update", "fallback.delete",
)


def pending_events(environment: Environment):
    """Input changes the latest ready snapshot does not contain. Delimited by audit
    id, never by time (seed 000): the newest request that produced or matched that
    snapshot (a deduplicated publish confirms the snapshot holds everything up to
    its own request)."""
    latest = latest_ready_snapshot(environment)
    events = AuditEvent.objects.filter(environment=environment, action__in=INPUT_ACTIONS)
    if latest is not None:
        boundary = Publication.objects.filter(
            snapshot=latest, state=Publication.State.READY
        ).aggregate(newest=Max("inputs_audit_id"))["newest"]
        events = events.filter(id__gt=boundary or latest.inputs_audit_id or 0)
    return latest, events


def pending_change_count(environment: Environment) -> int:
    """How many changes wait to roll out, without rendering anything."""
    return pending_events(environment)[1].count()


def pending_changes(environment: Environment) -> dict:
    """The pending events and the diff of rendering now against the latest snapshot."""
    latest, events = pending_events(environment)
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
