"""Strategies, default strategies and webhooks in the admin: created through the
services (audited), definitions and URLs checked as the API checks them, the
webhook secret shown once in a message, everything scoped to what a staff user
owns."""

import json

import pytest

from apps.audit.models import Action, AuditEvent
from apps.rollouts.models import EnvironmentStrategy, RolloutStrategy
from apps.webhooks import services
from apps.webhooks.models import WebhookEndpoint
from tests.admin.support import listed, messages_of

pytestmark = pytest.mark.django_db

STRATEGIES = "/admin/rollouts/rolloutstrategy/"
DEFAULTS = "/admin/rollouts/environmentstrategy/"
WEBHOOKS = "/admin/webhooks/webhookendpoint/"
DEFINITION = {"canary": {"count": 1}, "waves": [{"percent": 100, "gate": "auto"}]}


def test_a_tenant_owner_adds_a_strategy_and_sets_a_default(login, tenant_owner, tenant,
                                                          environment):
    client = login(tenant_owner)
    response = client.post(f"{STRATEGIES}add/", {
        "tenant": tenant.pk, "name": "mine", "description": "",
        "definition": json.dumps(DEFINITION)})
    assert response.status_code == 302, response.content[:2000]
    strategy = RolloutStrategy.objects.get(name="mine")
    assert AuditEvent.objects.filter(action=Action.STRATEGY_CREATE).exists()
    assert {s.name for s in listed(client.get(STRATEGIES))} >= {"mine", "all-at-once"}

    response = client.post(f"{DEFAULTS}add/", {"environment": environment.pk,
                                                "strategy": strategy.pk})
    assert response.status_code == 302, response.content[:2000]
    assert EnvironmentStrategy.objects.get().strategy == strategy
    assert AuditEvent.objects.filter(action=Action.STRATEGY_DEFAULT).exists()


def test_a_bad_definition_is_a_form_error(login, tenant_owner, tenant):
    response = login(tenant_owner).post(f"{STRATEGIES}add/", {
        "tenant": tenant.pk, "name": "bad", "description": "",
        "definition": json.dumps({"waves": [{"percent": 0}]})})
    assert response.status_code == 200
    assert "waves[0].percent" in response.content.decode()
    assert not RolloutStrategy.objects.filter(name="bad").exists()


def test_an_owner_registers_a_webhook_and_the_secret_is_shown_once(
        login, tenant_owner, environment, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": False}
    client = login(tenant_owner)
    refused = client.post(f"{WEBHOOKS}add/", {"environment": environment.pk,
                                               "url": "http://127.0.0.1/x",
                                               "events": ["rollout.started"], "enabled": "on"})
    assert refused.status_code == 200 and not WebhookEndpoint.objects.exists()
    response = client.post(f"{WEBHOOKS}add/", {
        "environment": environment.pk, "url": "https://hooks.example.com/x",
        "events": ["rollout.started"], "description": "", "enabled": "on"}, follow=True)
    endpoint = WebhookEndpoint.objects.get()
    assert any(endpoint.secret in m for m in messages_of(response))
    assert endpoint.secret not in client.get(f"{WEBHOOKS}{endpoint.pk}/change/").content.decode()
    assert AuditEvent.objects.filter(action=Action.WEBHOOK_CREATE).exists()


def test_an_outsider_sees_no_webhook_of_shop(login, staff_outsider, environment, superuser,
                                             settings):
    services.endpoint_create(environment=environment, url="https://hooks.example.com/x",
                             events=["drift.reported"], actor=superuser)
    assert listed(login(staff_outsider).get(WEBHOOKS)) == []
