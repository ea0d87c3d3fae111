"""Quarantine by content: the checksum of content a rollout rolled back is
quarantined in its environment. `quarantine_of` is the one rule every path asks
(activation, push, pin, rollout create, a publication's outcome, the pending
view); `refuse_quarantined` turns it into a refusal or an owner's audited override.
"""

from django.db import transaction

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.events import emit
from apps.environments.models import Environment
from apps.rollouts.models import Rollout, SnapshotQuarantine
from apps.snapshots.models import Snapshot


def quarantine_of(environment_id: int, checksum: str) -> SnapshotQuarantine | None:
    """The quarantine of `checksum` in the environment, or None: content is
    quarantined by what it is, never by the number of the snapshot holding it."""
    if not checksum:
        return None
    return (SnapshotQuarantine.objects.select_related("snapshot")
            .filter(environment_id=environment_id, checksum=checksum).first())


def quarantines_by_checksum(environment_id: int) -> dict[str, SnapshotQuarantine]:
    """Every quarantine of the environment by checksum (one query, for lists)."""
    return {q.checksum: q for q in SnapshotQuarantine.objects.select_related("snapshot")
            .filter(environment_id=environment_id)}


def describe(quarantine: SnapshotQuarantine) -> str:
    by = f"rollout {quarantine.rollout_id}" if quarantine.rollout_id else "a rollout"
    return f"its content was rolled back as #{quarantine.snapshot.number} by {by}"


def refuse_quarantined(snapshot: Snapshot, *, actor=None, override_reason: str | None = None,
                       what: str = "released") -> None:
    """Refuse (409 quarantined) to release `snapshot` when its content is
    quarantined, naming the rolled-back snapshot and rollout; with an
    `override_reason` (an owner's, checked by the caller) it goes ahead, audited."""
    quarantine = quarantine_of(snapshot.environment_id, snapshot.checksum)
    if quarantine is None:
        return
    if override_reason is None:
        raise Conflict(
            f"#{snapshot.number} is quarantined: {describe(quarantine)}. Release fixed "
            "content instead, or an owner may override with a reason.", code="quarantined",
            details={"snapshot": snapshot.number, "quarantined": quarantine.as_dict()})
    if not override_reason.strip():
        raise ValidationFailed("Overriding a quarantine needs a reason.", code="reason_required")
    environment = snapshot.environment
    audit_record(actor=actor, action=Action.QUARANTINE_OVERRIDE, obj=snapshot,
                 environment=environment, tenant=environment.application.tenant,
                 summary=f"Quarantine of #{snapshot.number} overridden to be {what}: "
                         f"{override_reason.strip()}",
                 data={"number": snapshot.number, "checksum": snapshot.checksum, "what": what,
                       "reason": override_reason.strip(), "snapshot": quarantine.snapshot.number,
                       "rollout": quarantine.rollout_id})


def quarantine_record(*, rollout: Rollout, reason: str) -> SnapshotQuarantine:
    """Quarantine the content `rollout` rolled back (inside the rollback's transaction);
    content already quarantined keeps its first origin."""
    locks.require_transaction()
    snapshot = rollout.snapshot
    quarantine, _ = SnapshotQuarantine.objects.get_or_create(
        environment_id=rollout.environment_id, checksum=snapshot.checksum,
        defaults={"snapshot": snapshot, "rollout": rollout, "reason": reason})
    return quarantine


def quarantine_lift(*, environment: Environment, number: int, actor, reason: str = "") -> None:
    """Lift the quarantine of the content of snapshot `number` (an owner's act, audited)."""
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        snapshot = Snapshot.objects.filter(environment=locked, number=number).first()
        quarantine = quarantine_of(locked.pk, snapshot.checksum) if snapshot else None
        if quarantine is None:
            raise NotFound(f"#{number} of {locked.full_name} is not quarantined.",
                           code="not_quarantined")
        audit_record(actor=actor, action=Action.QUARANTINE_LIFT, obj=quarantine.snapshot,
                     environment=locked, tenant=locked.application.tenant,
                     summary=f"Lifted the quarantine of #{quarantine.snapshot.number}'s content"
                             + (f": {reason}" if reason else ""),
                     data={"checksum": quarantine.checksum, "reason": reason,
                           "snapshot": quarantine.snapshot.number,
                           "rollout": quarantine.rollout_id})
        quarantine.delete()
        emit("snapshot", environment_id=locked.pk, number=number)
