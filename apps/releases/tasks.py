"""Celery tasks of releases: thin wrappers that take ids and call one function."""

import logging

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.db import InterfaceError, OperationalError

from apps.releases import publishing
from apps.snapshots.selectors import stale_publication_ids

logger = logging.getLogger(__name__)


@shared_task(
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=5,
    acks_late=True,  # publication_complete is idempotent
)
def publication_render_task(publication_id: str) -> str:
    try:
        publication = publishing.publication_complete(publication_id=publication_id)
    except SoftTimeLimitExceeded:
        publication = publishing.publication_abandon(
            publication_id=publication_id, reason="rendering took too long and was stopped"
        )
    return publication.state


@shared_task
def publication_reconcile_task() -> int:
    """Periodic (beat): queue again the renders of publications still rendering
    after a while (a lost broker message or a killed worker). Safe: rendering is
    idempotent."""
    stale = stale_publication_ids()
    for publication_id in stale:
        logger.warning("publication %s still rendering; queueing it again", publication_id)
        publication_render_task.delay(str(publication_id))
    return len(stale)
