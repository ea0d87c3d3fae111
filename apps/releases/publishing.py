"""The worker's side of a publication: render it, store its outcome, and activate
a new snapshot where the release rules say so, through the release gate — all of
it in one transaction after the render, so a stored snapshot is never left waiting
for its activation, and an approved release is used only with the activation it
authorises (a render that fails uses nothing). What the gate refuses is stored
and held, saying why; in a governed environment a publish with the direct policy
asks for approval of activating its snapshot (docs/governance.md).
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction

from apps.core.errors import ApplicationError
from apps.environments.models import Environment
from apps.fleet.services import environment_activate
from apps.governance.gates import release_gate
from apps.governance.rules import activation_plan
from apps.governance.selectors import approval_missing
from apps.governance.services import release_submit
from apps.releases.rules import approval_hold, publication_activates
from apps.rollouts.models import Rollout
from apps.rollouts.quarantine import quarantine_of
from apps.snapshots.guard import degenerate_findings
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.rules import Outcome
from apps.snapshots.services import (
    failed_render,
    publication_activated,
    publication_claim,
    publication_gate_held,
    publication_hold,
    publication_rendered,
    publication_store,
)
from configlang.rendering import Rendered


def _held(environment: Environment, publication: Publication, outcome) -> dict | None:
    if outcome != Outcome.NEW or publication.confirmed or not publication.snapshot.is_ready:
        return None
    return degenerate_findings(environment, publication.snapshot.files)


def _finish(publication: Publication, rendered: Rendered) -> Publication:
    with transaction.atomic():
        environment = Environment.objects.lock(publication.environment_id)
        publication, outcome = publication_store(environment=environment,
                                                 publication_id=publication.pk,
                                                 rendered=rendered)
        held = _held(environment, publication, outcome)
        if held is not None:  # stored, never activated until someone confirms
            publication_hold(publication, held)
        elif publication_activates(
                outcome=outcome, is_rollback=publication.kind == Publication.Kind.ROLLBACK,
                release_policy=environment.release_policy,
                rollout_active=Rollout.objects.active_in(environment).exists(),
                quarantined=publication.snapshot is not None
                and quarantine_of(environment.pk, publication.snapshot.checksum) is not None):
            _activate_through_gate(environment, publication)
    return publication


def gated_content(publication: Publication) -> Snapshot:
    """The snapshot whose content the release gate judges when `publication`'s
    snapshot is activated: a rollback's restored snapshot when the re-render holds
    exactly its content (its approval names that number); otherwise its own (a
    rollback rendered into other bytes, the engine having changed, is new)."""
    restored = (publication.rolled_back_from
                if publication.kind == Publication.Kind.ROLLBACK else None)
    if restored is not None and restored.checksum == publication.snapshot.checksum:
        return restored
    return publication.snapshot


def _activate_through_gate(environment: Environment, publication: Publication) -> None:
    """Activate the stored snapshot if the release gate lets it, now (a savepoint:
    the gate's use of a release and the activation stand or fall together). A
    rollback passes it as its request did, against the content it restores; its
    approved release is used here, as long as its render restored exactly that
    content (else its own content is gated). A refusal holds the snapshot, recorded."""
    rollback = publication.kind == Publication.Kind.ROLLBACK
    try:
        with transaction.atomic():
            release_gate(environment=environment, snapshot=gated_content(publication),
                         plan=activation_plan(), actor=publication.author,
                         what="rollback" if rollback else "activation",
                         confirmed=publication.confirmed, restores=rollback)
            environment_activate(environment=environment, snapshot=publication.snapshot)
            publication_activated(publication)
    except ApplicationError as refusal:
        gate_held(environment, publication, refusal, publication.author)


def gate_held(environment: Environment, publication: Publication, refusal: ApplicationError,
              actor) -> None:
    """Hold the stored snapshot for the gate's refusal, recorded; for a missing
    approval (but a rollback's) a release asking to activate it is submitted by
    `actor` first, and the hold names it."""
    held = {"code": refusal.code, "message": refusal.message, "details": refusal.details}
    if refusal.code == "approval_required" and publication.kind != Publication.Kind.ROLLBACK:
        held = _approval_asked(environment, publication, actor) or held
    publication_gate_held(publication, held)


def _approval_asked(environment: Environment, publication: Publication,
                    actor) -> dict | None:
    """A release asking to activate the publication's snapshot, submitted by `actor`
    (approvers are notified); the hold names it. None when it cannot be submitted
    (the refusal is held as it is)."""
    try:
        release = release_submit(
            environment=environment, snapshot=publication.snapshot, plan=activation_plan(),
            actor=actor,
            note="Published with the direct release policy: activating it needs approval.")
    except ApplicationError:
        return None
    return approval_hold(environment=environment.full_name,
                         number=publication.snapshot.number, release=release.pk,
                         missing=approval_missing(release))


def publication_complete(*, publication_id: str) -> Publication:
    """Claim a queued publication, render it and finish it. Idempotent and cheap
    to repeat: a finished one, or one another worker claimed within a render's
    time limit, is returned as it is (a duplicate message renders nothing)."""
    lifetime = timedelta(seconds=settings.BELLWETHER_RENDER_CLAIM_S)
    if not publication_claim(publication_id=publication_id, claim_lifetime=lifetime):
        return Publication.objects.get(pk=publication_id)
    publication = Publication.objects.get(pk=publication_id)
    return _finish(publication, publication_rendered(publication))


def publication_abandon(*, publication_id: str, reason: str) -> Publication:
    """Finish a publication whose render could not complete (e.g. it timed out)."""
    return _finish(Publication.objects.get(pk=publication_id), failed_render(reason))
