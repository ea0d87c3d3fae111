"""Celery tasks for webhooks: deliver an endpoint's deliveries (again after the
backoff when one failed), and the periodic sweep of those due."""

from celery import shared_task

from apps.webhooks import delivery


@shared_task(bind=True, acks_late=True)  # idempotent: the lease and states decide
def webhook_deliver_task(self, endpoint_id: int) -> float | None:
    wait = delivery.endpoint_deliver(endpoint_id=endpoint_id)
    # Inline (embedded mode, tests) a countdown is not honoured: only a retry due
    # now runs again at once; a later one is the sweep's.
    if wait is not None and (not self.request.is_eager or wait <= 0):
        webhook_deliver_task.apply_async((endpoint_id,), countdown=wait)
    return wait


@shared_task
def webhooks_sweep_task() -> int:
    """Periodic (beat): queue every endpoint with a delivery due."""
    due = delivery.endpoints_due()
    for endpoint_id in due:
        webhook_deliver_task.delay(endpoint_id)
    return len(due)
