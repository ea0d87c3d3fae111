"""Promotion (what staging runs, published in production as a change) and the
confirmation of a degenerate render held back from activation."""

from django.db import transaction

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import ApplicationError, Conflict
from apps.environments.models import Environment
from apps.governance import gates
from apps.releases.publishing import gate_held, gated_content
from apps.releases.services import snapshot_activate, snapshot_publish
from apps.snapshots.models import Publication
from apps.snapshots.promotion import promoted_snapshot
from apps.snapshots.services import publication_activated


def snapshot_promote(*, source: Environment, target: Environment, actor,
                     expected_number: int | None = None,
                     confirmed: bool = False) -> Publication:
    """Publish in `target` what `source` runs: its active snapshot's release (the
    descriptor) applied to `target`'s own inputs, through the normal publishing
    service (its release policy, its gates). Audited as snapshot.promote with the
    origin; the publication's source records it too."""
    with transaction.atomic():
        promoted = promoted_snapshot(source=source, target=target,
                                     expected_number=expected_number)
        publication = snapshot_publish(environment=target, actor=actor, promoted=promoted,
                                       confirmed=confirmed)
        audit_record(actor=actor, action=Action.SNAPSHOT_PROMOTE, obj=publication,
                     environment=target, tenant=target.application.tenant,
                     summary=f"Promoted {source.full_name} #{promoted.number} to "
                             f"{target.full_name}",
                     data={"from": source.full_name, "number": promoted.number,
                           "checksum": promoted.checksum, "publication": str(publication.pk)})
    return publication


def publication_confirm(*, publication: Publication, actor) -> Publication:
    """Confirm a publication held for its degenerate render: recorded (audited),
    and its snapshot activated when the publication was meant to activate it (with
    activation's checks: no rollout, not quarantined, not older than the active,
    the release gate — a rollback's content as an environment rollback's; what the
    gate refuses holds it, saying why)."""
    with transaction.atomic():
        Environment.objects.lock(publication.environment_id)
        locked = locks.lock_one(Publication.objects.select_related("snapshot", "environment"),
                                pk=publication.pk)
        if locked.needs_confirmation is None or locked.state != Publication.State.READY:
            raise Conflict("This publication needs no confirmation.",
                           code="nothing_to_confirm")
        if locked.confirmed:
            return locked
        locked.confirmed = True
        locked.save(update_fields=["confirmed"])
        audit_record(actor=actor, action=Action.PUBLICATION_CONFIRM, obj=locked,
                     environment=locked.environment,
                     tenant=locked.environment.application.tenant,
                     summary=f"Confirmed #{locked.snapshot.number} of "
                             f"{locked.environment.full_name} despite its render",
                     data={"number": locked.snapshot.number, **locked.needs_confirmation})
        if locked.activates and not locked.activated:
            _confirmed_activation(locked, actor)
    return locked


def _confirmed_activation(publication: Publication, actor) -> None:
    """Activate a confirmed publication's snapshot (a savepoint). What the release
    gate refuses holds it, as the worker's activation does, the confirmation
    recorded all the same: in a governed environment a release asking to activate
    it is submitted by whoever confirmed (docs/governance.md)."""
    try:
        with transaction.atomic():
            snapshot_activate(snapshot=publication.snapshot, actor=actor, confirmed=True,
                              restores=publication.kind == Publication.Kind.ROLLBACK,
                              gated_as=gated_content(publication))
            publication_activated(publication)
    except ApplicationError as refusal:
        if refusal.code not in gates.REFUSALS:
            raise
        gate_held(publication.environment, publication, refusal, actor)
