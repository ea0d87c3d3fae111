"""Delivering an endpoint's deliveries, in sequence order (docs/webhooks.md,
"Ordering"): one worker at a time per endpoint (a lease on its row), the oldest
pending delivery first, and none after it while it waits to be tried again — so a
receiver gets an endpoint's events in order, a delivery given up on (after
BELLWETHER_WEBHOOK_MAX_ATTEMPTS) leaving a gap in the sequence. No lock is held
while a request is in flight: each attempt is logged in its own short transaction."""

import time
from datetime import timedelta

from django.conf import settings
from django.db.models import OuterRef, Q, Subquery
from django.utils import timezone

from apps.webhooks import rules, transport
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint

# Deliveries one run sends before it hands over to a fresh run (fairness).
BATCH = 50
MAX_LOG = 20


def _limits() -> dict:
    return settings.BELLWETHER_WEBHOOKS


def _lease(endpoint_id: int) -> bool:
    """Claim the endpoint for this run; False while another run holds it."""
    now = timezone.now()
    # Each attempt takes at most its lookup, connecting, each read: the batch's lease.
    limits = _limits()
    lease = timedelta(seconds=BATCH * (limits["resolve_timeout_s"] + limits["timeout_s"] + 1))
    return bool(WebhookEndpoint.objects.filter(pk=endpoint_id).filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now)).update(lease_until=now + lease))


def _headers(delivery: WebhookDelivery, secret: str, body: bytes) -> dict:
    timestamp = int(time.time())
    return {"Content-Type": "application/json", "User-Agent": "Bellwether-Webhooks/1",
            "X-Bellwether-Event": delivery.event, "X-Bellwether-Delivery": str(delivery.pk),
            "X-Bellwether-Sequence": str(delivery.sequence),
            "X-Bellwether-Timestamp": str(timestamp),
            rules.SIGNATURE_HEADER: rules.signature(secret, timestamp, body)}


def attempt(delivery: WebhookDelivery, endpoint: WebhookEndpoint) -> transport.Outcome:
    """Send one attempt and log it: succeeded on a 2xx; given up after the last
    attempt or on a refused address; else due again after its backoff."""
    body = delivery.body.encode()
    outcome = transport.post(endpoint.url, body, _headers(delivery, endpoint.secret, body),
                             timeout_s=_limits()["timeout_s"],
                             allow_private=_limits()["allow_private"],
                             resolve_wait_s=_limits()["resolve_timeout_s"])
    now = timezone.now()
    delivery.attempts += 1
    delivery.last_status, delivery.last_error = outcome.status, outcome.error
    delivery.log = [*delivery.log, {"at": now.isoformat(), "status": outcome.status,
                                    "error": outcome.error, "ms": outcome.ms,
                                    "response": outcome.response[:500]}][-MAX_LOG:]
    if outcome.succeeded:
        delivery.state, delivery.delivered_at = WebhookDelivery.State.SUCCEEDED, now
    elif outcome.refused or delivery.attempts >= _limits()["max_attempts"]:
        delivery.state = WebhookDelivery.State.FAILED
    else:
        delivery.next_attempt_at = now + timedelta(seconds=rules.backoff_s(
            delivery.attempts, base_s=_limits()["backoff_s"], most_s=_limits()["backoff_max_s"]))
    delivery.save(update_fields=["attempts", "last_status", "last_error", "log", "state",
                                 "delivered_at", "next_attempt_at"])
    return outcome


def _deliver_in_order(endpoint_id: int) -> float | None:
    for _ in range(BATCH):
        endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id, enabled=True).first()
        head = (WebhookDelivery.objects.filter(endpoint_id=endpoint_id,
                                               state=WebhookDelivery.State.PENDING)
                .order_by("sequence").first()) if endpoint else None
        if head is None:
            return None
        wait = (head.next_attempt_at - timezone.now()).total_seconds()
        if wait > 0:
            return wait
        attempt(head, endpoint)
        if head.state == WebhookDelivery.State.PENDING:
            return max(0.0, (head.next_attempt_at - timezone.now()).total_seconds())
    return 0.0


def endpoint_deliver(*, endpoint_id: int) -> float | None:
    """Deliver the endpoint's due deliveries in sequence order. Returns the seconds
    until its next delivery is due (its task runs again then), or None when
    nothing is pending or another run holds the endpoint."""
    if not _lease(endpoint_id):
        return None
    try:
        return _deliver_in_order(endpoint_id)
    finally:
        WebhookEndpoint.objects.filter(pk=endpoint_id).update(lease_until=None)


def endpoints_due() -> list[int]:
    """Enabled endpoints with a pending delivery due and no run holding them: what the
    periodic sweep queues again (a prompt lost with its broker message, or a retry
    an inline run left for later)."""
    now = timezone.now()
    # The oldest pending delivery decides: those after it wait for it (ordering).
    head = (WebhookDelivery.objects.filter(endpoint_id=OuterRef("pk"),
                                           state=WebhookDelivery.State.PENDING)
            .order_by("sequence").values("next_attempt_at")[:1])
    return list(WebhookEndpoint.objects.filter(enabled=True).filter(
        Q(lease_until__isnull=True) | Q(lease_until__lt=now))
        .annotate(head_due_at=Subquery(head)).filter(head_due_at__lte=now)
        .values_list("pk", flat=True)[:1000])
