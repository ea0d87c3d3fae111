"""Reads that span the domain apps: what a snapshot is (active, quarantined) and
the pending changes with what a rollback says about them."""

from django.db.models import Count, OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from apps.core.errors import Unavailable
from apps.environments.models import Environment
from apps.releases.rules import release_note
from apps.rollouts.models import ACTIVE_STATES, Rollout
from apps.rollouts.quarantine import quarantine_of, quarantines_by_checksum
from apps.snapshots.models import Publication, Snapshot, stored_bytes, without_content
from apps.snapshots.selectors import pending_changes, snapshot_preview


def environments_live(environments: QuerySet) -> QuerySet:
    """`environments` with what is live: the active snapshot joined (without its
    content) and the active rollout's id, state, current wave and snapshot number
    annotated — no query per environment."""
    active = Rollout.objects.active().filter(environment=OuterRef("pk"))
    return without_content(environments.select_related("active_snapshot"),
                           "active_snapshot").annotate(
        active_rollout_id=Subquery(active.values("pk")[:1]),
        active_rollout_state=Subquery(active.values("state")[:1]),
        active_rollout_wave=Subquery(active.values("current_wave")[:1]),
        active_rollout_snapshot=Subquery(active.values("snapshot__number")[:1]))


def publication_release(publication: Publication, *, snapshot_active: bool) -> dict:
    """What a publication says about its release: {policy, released_by, note}."""
    policy = publication.environment.release_policy
    return {"policy": policy, **release_note(
        release_policy=policy, activates=publication.activates,
        activated=publication.activated, state=publication.state,
        snapshot_active=snapshot_active, held=publication.held)}


def snapshot_flags(environment: Environment) -> dict:
    """What the interfaces need to flag the environment's snapshots (two queries
    for any number of them): {"active": pk or None, "quarantines": by checksum}."""
    return {"active": environment.active_snapshot_id,
            "quarantines": quarantines_by_checksum(environment.pk)}


def snapshot_state(snapshot: Snapshot, flags: dict) -> dict:
    """{"active": bool, "quarantined": {snapshot, rollout, reason, at} or None}."""
    quarantine = flags["quarantines"].get(snapshot.checksum) if snapshot.checksum else None
    return {"active": snapshot.pk == flags["active"],
            "quarantined": quarantine.as_dict() if quarantine else None}


def _rolled_back(environment: Environment, checksum: str | None) -> dict | None:
    """Whether content rendered from the current inputs was rolled back: it is
    quarantined, or the environment's latest rollout rolled back that content."""
    if not checksum:
        return None
    quarantine = quarantine_of(environment.pk, checksum)
    if quarantine is not None:
        return {"rollout": quarantine.rollout_id, "snapshot": quarantine.snapshot.number}
    latest = (Rollout.objects.filter(environment=environment).select_related("snapshot")
              .order_by("-pk").first())
    if (latest is not None and latest.state == Rollout.State.ROLLED_BACK
            and latest.snapshot.checksum == checksum):
        return {"rollout": latest.pk, "snapshot": latest.snapshot.number}
    return None


def pending_view(environment: Environment) -> dict:
    """snapshots.selectors.pending_changes (the diff against the active snapshot),
    with `rolled_back` ({rollout, snapshot} or None) and a `message` saying so."""
    pending = pending_changes(environment)
    rolled_back = _rolled_back(environment, pending["checksum"])
    message = ""
    if rolled_back is not None:
        message = (f"These changes were rolled back in rollout {rolled_back['rollout']} "
                   f"(as #{rolled_back['snapshot']}); the active snapshot does not hold "
                   "them. An owner can reset the inputs to the active snapshot's source.")
    return {**pending, "rolled_back": rolled_back, "message": message}


def inputs_rolled_back(environment: Environment) -> dict | None:
    """Whether the environment's current inputs render to content a rollout rolled
    back: {rollout, snapshot} or None (renders the inputs; records nothing)."""
    try:
        rendered = snapshot_preview(environment)
    except Unavailable:  # too many renders at once: the page shows the rest
        return None
    return _rolled_back(environment, rendered.checksum if rendered.is_valid else None)


# --- retention -----------------------------------------------------------------------


def retention_usage(environment: Environment) -> dict:
    """What the environment stores against its bounds (no lock; for people)."""
    stored = Snapshot.objects.filter(environment=environment).with_stored_bytes()
    total = sum(stored.values_list("stored_bytes", flat=True))
    finished = (Rollout.objects.filter(environment=environment)
                .exclude(state__in=ACTIVE_STATES).count())
    return {"snapshots": {"count": stored.count(), "bound": environment.retention_snapshots},
            "bytes": {"stored": total, "bound": environment.retention_bytes},
            "rollouts": {"count": finished, "bound": environment.retention_rollouts}}


def over_bounds(usage: dict) -> bool:
    return (usage["snapshots"]["count"] > usage["snapshots"]["bound"]
            or usage["bytes"]["stored"] > usage["bytes"]["bound"]
            or usage["rollouts"]["count"] > usage["rollouts"]["bound"])


def environments_with_storage(environments: QuerySet) -> QuerySet:
    """`environments` annotated with stored_bytes and snapshot_count (one query for
    any number of them: the admin's list)."""
    mine = Snapshot.objects.filter(environment=OuterRef("pk")).order_by().values("environment")
    return environments.annotate(
        stored_bytes=Coalesce(Subquery(mine.annotate(total=Sum(stored_bytes()))
                                       .values("total")), 0),
        snapshot_count=Coalesce(Subquery(mine.annotate(n=Count("pk")).values("n")), 0))
