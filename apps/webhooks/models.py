"""Webhooks (docs/webhooks.md): endpoints an environment's owners register for domain
events, and the deliveries to each, numbered per endpoint and logged attempt by
attempt."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.environments.models import Environment
from apps.webhooks.rules import url_shown


class WebhookEndpoint(models.Model):
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="webhook_endpoints")
    url = models.CharField(max_length=2000)
    # The domain event names it receives (apps.core.events.DOMAIN_EVENTS).
    events = models.JSONField()
    description = models.CharField(max_length=200, blank=True)
    # Kept as given: the server must sign with it (docs/security.md, "Webhooks").
    # Shown once, when created or rotated; never by the API, the admin or the pages.
    secret = models.CharField(max_length=64, editable=False)
    enabled = models.BooleanField(default=True)
    # The sequence number the next delivery takes: one more per delivery, so a
    # receiver sees gaps (a delivery given up on) and order.
    next_sequence = models.PositiveBigIntegerField(default=1, editable=False)
    # While a worker delivers to this endpoint, no other does (ordering).
    lease_until = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        # Shown beyond the owners (the audit log's object, the delivery admin): no
        # path, query or credentials (apps.webhooks.rules.url_shown).
        return f"webhook {self.pk} of {self.environment_id} to {url_shown(self.url)}"


class WebhookDelivery(models.Model):
    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SUCCEEDED = "succeeded", "Succeeded"
        FAILED = "failed", "Failed (given up)"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.CASCADE,
                                 related_name="deliveries")
    sequence = models.PositiveBigIntegerField()
    event = models.CharField(max_length=64)
    # The exact bytes every attempt sends (signed afresh with each attempt's time).
    body = models.TextField()
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField()
    last_status = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True)
    # [{at, status, error, ms, response}] per attempt; a response excerpt is bounded.
    log = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["endpoint_id", "-sequence"]
        verbose_name_plural = "webhook deliveries"
        constraints = [
            models.UniqueConstraint(fields=["endpoint", "sequence"],
                                    name="webhook_delivery_sequence_unique"),
            models.CheckConstraint(condition=Q(state__in=["pending", "succeeded", "failed"]),
                                   name="webhook_delivery_state_valid"),
        ]
        indexes = [models.Index(fields=["state", "next_attempt_at"],
                                name="webhook_delivery_due_idx")]

    def __str__(self) -> str:
        return f"#{self.sequence} {self.event} ({self.state})"
