"""Celery tasks for rollouts: thin wrappers over the services."""

from celery import shared_task

from apps.rollouts import reconcile


@shared_task(acks_late=True)  # reconcile is idempotent
def rollout_reconcile_task(rollout_id: int) -> str:
    return reconcile.rollout_reconcile(rollout_id=rollout_id)


@shared_task
def rollouts_reconcile_task() -> dict:
    """Periodic (beat): advance, pause or roll back running rollouts."""
    return reconcile.rollouts_reconcile()
