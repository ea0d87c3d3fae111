"""Celery tasks for snapshots: thin wrappers over the services."""

from celery import shared_task
from celery.exceptions import SoftTimeLimitExceeded
from django.db import InterfaceError, OperationalError

from apps.snapshots import services


@shared_task(
    autoretry_for=(OperationalError, InterfaceError),
    retry_backoff=True,
    max_retries=5,
    acks_late=True,  # publication_render is idempotent
)
def publication_render_task(publication_id: str) -> str:
    try:
        publication = services.publication_render(publication_id=publication_id)
    except SoftTimeLimitExceeded:
        publication = services.publication_fail(
            publication_id=publication_id, reason="rendering took too long and was stopped"
        )
    return publication.state


@shared_task
def publication_reconcile_task() -> int:
    """Periodic (beat): re-queue publications whose render was lost."""
    return services.publication_reconcile()
