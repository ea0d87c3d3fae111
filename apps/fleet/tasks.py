"""Celery tasks for the fleet: thin wrappers over the services."""

from celery import shared_task

from apps.fleet import heartbeats, services


@shared_task
def heartbeats_flush_task() -> int:
    """Periodic (beat): copy agents' heartbeats from the cache to the database."""
    return heartbeats.heartbeats_flush()


@shared_task
def poll_invalidations_sweep_task() -> int:
    """Periodic (beat): settle the poll invalidations past their grace period."""
    return services.poll_invalidations_sweep()
