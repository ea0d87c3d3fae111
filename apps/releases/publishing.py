"""The worker's side of a publication: render it, store its outcome, and activate
a new snapshot where the release rules say so — all of it in one transaction
after the render, so a stored snapshot is never left waiting for its activation.
"""

from datetime import timedelta

from django.conf import settings
from django.db import transaction

from apps.environments.models import Environment
from apps.fleet.services import environment_activate
from apps.governance.gates import direct_activation_held
from apps.releases.rules import publication_activates
from apps.rollouts.models import Rollout
from apps.rollouts.quarantine import quarantine_of
from apps.snapshots.guard import degenerate_findings
from apps.snapshots.models import Publication
from apps.snapshots.rules import Outcome
from apps.snapshots.services import (
    failed_render,
    publication_activated,
    publication_claim,
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
                and quarantine_of(environment.pk, publication.snapshot.checksum) is not None,
                governance_holds=publication.kind != Publication.Kind.ROLLBACK
                and direct_activation_held(environment)):
            environment_activate(environment=environment, snapshot=publication.snapshot)
            publication_activated(publication)
    return publication


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
