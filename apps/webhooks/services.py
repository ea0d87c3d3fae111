"""Webhook endpoints and their deliveries (docs/webhooks.md): owners register,
change, rotate the secret of and delete endpoints (each audited in its
transaction); every domain event an endpoint subscribes to becomes a delivery,
numbered per endpoint, in the transaction that announced it, and is queued for
delivery when that transaction commits."""

import secrets as secrets_module

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.dispatch import queue_on_commit
from apps.core.errors import Conflict, ValidationFailed
from apps.environments.models import Environment
from apps.webhooks import rules, transport
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint
from apps.webhooks.tasks import webhook_deliver_task


def _limits() -> dict:
    return settings.BELLWETHER_WEBHOOKS


def url_problem(url: str) -> str | None:
    """Why `url` cannot be an endpoint's, or None: its form (apps.webhooks.rules) and,
    unless private addresses are allowed, every address its host resolves to now,
    within BELLWETHER_WEBHOOK_RESOLVE_TIMEOUT_S (a name that does not resolve, or
    whose resolver does not answer in time, passes: each delivery resolves and
    checks it again)."""
    allow_private = _limits()["allow_private"]
    problem = rules.url_problem(url, allow_private=allow_private)
    if problem is None and not allow_private:
        problem = transport.host_refusal(url, wait_s=_limits()["resolve_timeout_s"])
    return problem


def _check(url: str | None, events, url_checked: bool = False) -> None:
    """400 naming the field of a bad URL or event list. `url_checked`: the caller
    has just checked the URL with url_problem (the admin's form, where a refusal is
    a form error), so its host is not resolved a second time — the second answer
    could differ, and a refusal then would come after the form was accepted."""
    problems = []
    if url is not None and not url_checked:
        problem = url_problem(url)
        if problem:
            problems.append({"field": "url", "message": problem})
    if events is not None:
        problem = rules.events_problem(events)
        if problem:
            problems.append({"field": "events", "message": problem})
    if problems:
        raise ValidationFailed(f"{problems[0]['field']}: {problems[0]['message']}",
                               details=problems)


def _new_secret() -> str:
    return "whsec_" + secrets_module.token_urlsafe(32)


def endpoint_create(*, environment: Environment, url: str, events: list[str], actor,
                    description: str = "", url_checked: bool = False
                    ) -> tuple[WebhookEndpoint, str]:
    """Register an endpoint; returns it with its secret, shown this once
    (`url_checked`: see _check)."""
    _check(url, events, url_checked)
    secret = _new_secret()
    with transaction.atomic():
        env = Environment.objects.lock(environment.pk)
        bound = _limits()["max_endpoints"]
        if WebhookEndpoint.objects.filter(environment=env).count() >= bound:
            raise Conflict(f"{env.full_name} has {bound} webhook endpoints, the most it "
                           "may have (BELLWETHER_WEBHOOK_MAX_ENDPOINTS).",
                           code="too_many_endpoints")
        endpoint = WebhookEndpoint.objects.create(
            environment=env, url=url, events=events, description=description, secret=secret,
            created_by=actor if getattr(actor, "is_authenticated", False) else None)
        audit_record(actor=actor, action=Action.WEBHOOK_CREATE, obj=endpoint, environment=env,
                     summary=f"Webhook {endpoint.pk} to {rules.url_shown(url)} for "
                             f"{', '.join(events)}",
                     data={"url": rules.url_shown(url), "events": events})
    return endpoint, secret


def _audited(changes: dict) -> dict:
    """What the audit log keeps of a change: the URL as shown to every reader of the
    log (deployers too), never its path, query or credentials."""
    return {**changes, **({"url": rules.url_shown(changes["url"])} if "url" in changes else {})}


def endpoint_update(*, endpoint: WebhookEndpoint, actor, url: str | None = None,
                    events: list[str] | None = None, enabled: bool | None = None,
                    description: str | None = None, rotate_secret: bool = False,
                    url_checked: bool = False) -> tuple[WebhookEndpoint, str | None]:
    """Change what is given; with rotate_secret a new secret, returned this once
    (deliveries still pending are signed with it from their next attempt;
    `url_checked`: see _check)."""
    _check(url, events, url_checked)
    changes = {k: v for k, v in {"url": url, "events": events, "enabled": enabled,
                                 "description": description}.items() if v is not None}
    secret = _new_secret() if rotate_secret else None
    with transaction.atomic():
        Environment.objects.lock(endpoint.environment_id)
        locked = locks.lock_one(WebhookEndpoint.objects, pk=endpoint.pk)
        for name, value in changes.items():
            setattr(locked, name, value)
        if secret:
            locked.secret = secret
        locked.save(update_fields=[*changes, *(["secret"] if secret else [])])
        audit_record(actor=actor, action=Action.WEBHOOK_UPDATE, obj=locked,
                     environment=locked.environment,
                     summary=f"Webhook {locked.pk} changed: "
                             + ", ".join([*changes, *(["secret rotated"] if secret else [])]),
                     data=_audited(changes))
        if enabled:
            queue_deliveries(locked.pk)
    return locked, secret


def endpoint_delete(*, endpoint: WebhookEndpoint, actor) -> None:
    """Delete an endpoint with its delivery log."""
    with transaction.atomic():
        Environment.objects.lock(endpoint.environment_id)
        locked = locks.lock_one(WebhookEndpoint.objects, pk=endpoint.pk)
        audit_record(actor=actor, action=Action.WEBHOOK_DELETE, obj=locked,
                     environment=locked.environment,
                     summary=f"Webhook {locked.pk} to {rules.url_shown(locked.url)} deleted")
        locked.delete()


def queue_deliveries(endpoint_id: int) -> None:
    """Prompt a worker to deliver the endpoint's pending deliveries after commit."""
    queue_on_commit(webhook_deliver_task, endpoint_id)


def _record(name: str, environment_id: int, data: dict) -> None:
    endpoints = [e for e in locks.lock_all(WebhookEndpoint.objects.filter(
        environment_id=environment_id, enabled=True).select_related("environment__application"))
        if name in e.events]
    if not endpoints:
        return
    now = timezone.now()
    deliveries = []
    for endpoint in endpoints:
        deliveries.append(WebhookDelivery(
            endpoint=endpoint, sequence=endpoint.next_sequence, event=name,
            next_attempt_at=now, body=rules.body(
                event=name, sequence=endpoint.next_sequence, data=data,
                environment=endpoint.environment.full_name, occurred_at=now.isoformat())))
        endpoint.next_sequence += 1
    WebhookEndpoint.objects.bulk_update(endpoints, ["next_sequence"])
    WebhookDelivery.objects.bulk_create(deliveries)
    for endpoint in endpoints:
        queue_deliveries(endpoint.pk)


def event_record(name: str, *, environment_id: int, data: dict) -> None:
    """The subscriber of domain events (apps.core.events): a delivery for every
    enabled endpoint of the environment that takes `name`, numbered under the
    endpoint's row lock, so sequence order is commit order."""
    if transaction.get_connection().in_atomic_block:
        _record(name, environment_id, data)
    else:
        with transaction.atomic():
            _record(name, environment_id, data)
