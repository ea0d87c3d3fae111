"""Celery tasks for the fleet: thin wrappers over the services."""

from celery import shared_task

from apps.fleet import services


@shared_task
def heartbeats_flush_task() -> int:
    """Periodic (beat): copy agents' heartbeats from the cache to the database."""
    return services.heartbeats_flush()
