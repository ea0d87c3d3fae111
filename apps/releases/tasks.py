"""Celery tasks of releases: thin wrappers that take ids and call one function."""

import logging
from datetime import timedelta

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError

from apps.releases import publishing
from apps.snapshots.selectors import stale_publication_ids

logger = logging.getLogger(__name__)


@shared_task(
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=5,
    acks_late=True,  # publication_complete is idempotent
    # Its own limits, well under a minute: a claim older than the hard limit is
    # dead, so beat can queue the render again soon after a worker dies.
    time_limit=settings.BELLWETHER_RENDER_TIME_LIMIT_S,
    soft_time_limit=settings.BELLWETHER_RENDER_SOFT_TIME_LIMIT_S,
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
    """Periodic (beat, every 10 s): the publications are the outbox of their render
    tasks. Queue again the render of each one no worker claimed in time (a lost
    message, a broker down at commit) or whose claim outlived the render's hard
    limit (its worker died). Safe: a duplicate message renders nothing."""
    stale = stale_publication_ids(
        unclaimed_after=timedelta(seconds=settings.BELLWETHER_RENDER_UNCLAIMED_S),
        claim_lifetime=timedelta(seconds=settings.BELLWETHER_RENDER_CLAIM_S))
    for publication_id in stale:
        logger.warning("publication %s still rendering; queueing it again", publication_id)
        publication_render_task.delay(str(publication_id))
    return len(stale)

