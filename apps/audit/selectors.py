"""Reads of the audit log, including what is waiting to roll out."""

from django.db.models import Count, Max, OuterRef, Subquery
from django.db.models.functions import Coalesce

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.diff import diff_files
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.selectors import latest_ready_snapshot, snapshot_preview

# The changes a snapshot is rendered from; others (owners, agents, activation)
# do not wait for a rollout.
INPUT_ACTIONS = (
    "environment.create", "environment.update",
    "template.create", "template.update", "template.delete",
    "fallback.create", "fallback.update", "fallback.delete",
)


def _pending_boundary():
    """The audit id up to which an environment's latest ready snapshot holds every
    input change, as an expression over Environment rows (0: nothing published).
    Delimited by audit id, never by time (seed 000): the newest request that
    produced or matched that snapshot (a deduplicated publish confirms the snapshot
    holds everything up to its own request)."""
    def latest(environment):
        return (Snapshot.objects.filter(environment=environment, state=Snapshot.State.READY)
                .order_by("-number"))

    confirmed = (Publication.objects
                 .filter(snapshot=Subquery(latest(OuterRef(OuterRef("pk"))).values("pk")[:1]),
                         state=Publication.State.READY)
                 .order_by().values("snapshot").annotate(newest=Max("inputs_audit_id"))
                 .values("newest"))
    return Coalesce(Subquery(confirmed[:1]),
                    Subquery(latest(OuterRef("pk")).values("inputs_audit_id")[:1]), 0)


def with_pending_counts(environments):
    """`environments` annotated with pending_count: how many input changes wait to
    roll out (one query for any number of environments; nothing is rendered)."""
    waiting = (AuditEvent.objects
               .filter(environment=OuterRef("pk"), action__in=INPUT_ACTIONS,
                       id__gt=OuterRef("pending_boundary"))
               .order_by().values("environment").annotate(n=Count("pk")).values("n"))
    return (environments.annotate(pending_boundary=_pending_boundary())
            .annotate(pending_count=Coalesce(Subquery(waiting), 0)))


def pending_events(environment: Environment):
    """The latest ready snapshot and the input changes it does not contain."""
    boundary = (Environment.objects.filter(pk=environment.pk)
                .annotate(boundary=_pending_boundary()).values_list("boundary", flat=True)
                .get())
    events = AuditEvent.objects.filter(environment=environment, action__in=INPUT_ACTIONS,
                                       id__gt=boundary)
    return latest_ready_snapshot(environment), events


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
