"""The dashboard's webhooks page (owners: register with the secret shown once,
delete, the delivery log as an htmx partial) and the rollout form's strategy."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.core.events import announce
from apps.rollouts.models import Rollout
from apps.webhooks.models import WebhookEndpoint
from tests.dashboard.test_views import candidate, nodes, second, text, url  # noqa: F401, F811
from tests.factories import session_client

pytestmark = pytest.mark.django_db

HOOK = {"url": "https://hooks.example.com/bw", "events": ["rollout.started",
                                                          "drift.reported"]}


@pytest.fixture(autouse=True)
def _cache(empty_cache):
    """Poll states live in the cache."""


@pytest.fixture
def as_owner(member, environment):
    return session_client(member("owner"))


@pytest.fixture
def as_deployer(member, environment):
    return session_client(member("deployer"))


def test_an_owner_registers_a_webhook_and_sees_its_secret_once(as_owner, environment):
    response = as_owner.post(url("webhooks"), HOOK)
    assert response.status_code == 201, text(response)[:2000]
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.secret in text(response)
    assert AuditEvent.objects.filter(action=Action.WEBHOOK_CREATE).exists()
    later = as_owner.get(url("webhooks"))
    assert later.status_code == 200
    assert endpoint.secret not in text(later) and HOOK["url"] in text(later)


def test_a_bad_url_is_400_on_its_field_and_nothing_is_written(as_owner, environment):
    response = as_owner.post(url("webhooks"), {**HOOK, "url": "http://10.0.0.1/x"})
    assert response.status_code == 400
    assert "private or loopback" in text(response)
    assert not WebhookEndpoint.objects.exists()


def test_a_deployer_may_not_see_or_register_webhooks(as_deployer, environment):
    assert as_deployer.get(url("webhooks")).status_code == 403
    assert as_deployer.post(url("webhooks"), HOOK).status_code == 403
    assert not WebhookEndpoint.objects.exists()


def test_the_delivery_log_refreshes_as_a_partial(as_owner, environment):
    as_owner.post(url("webhooks"), HOOK)
    announce("drift.reported", environment_id=environment.pk, agent=1)
    response = as_owner.get(url("webhooks"), HTTP_HX_REQUEST="true")
    html = text(response)
    assert response.status_code == 200 and html.lstrip().startswith('<div id="endpoints"')
    assert "drift.reported" in html and "pending" in html


def test_an_owner_deletes_a_webhook(as_owner, as_deployer, environment):
    as_owner.post(url("webhooks"), HOOK)
    endpoint = WebhookEndpoint.objects.get()
    as_deployer.post(url("webhook-delete"), {"endpoint": endpoint.pk})
    assert WebhookEndpoint.objects.exists()
    assert as_owner.post(url("webhook-delete"), {"endpoint": endpoint.pk}).status_code == 302
    assert not WebhookEndpoint.objects.exists()
    assert as_owner.post(url("webhook-delete"), {"endpoint": endpoint.pk}).status_code == 404


def test_the_rollout_form_starts_a_rollout_from_a_strategy(as_deployer, candidate, nodes):  # noqa: F811
    response = as_deployer.post(url("rollout-new"), {"snapshot": "3", "strategy": "all-at-once",
                                                     "waves": "", "gate": "manual"})
    assert response.status_code == 302, text(response)[:2000]
    rollout = Rollout.objects.get()
    assert rollout.strategy.name == "all-at-once"
    assert [w["size"] for w in rollout.waves] == [3]


def test_the_rollout_form_without_strategy_still_needs_canaries(as_deployer, candidate,  # noqa: F811
                                                                nodes):  # noqa: F811
    response = as_deployer.post(url("rollout-new"), {"snapshot": "3", "waves": "100",
                                                     "gate": "manual"})
    assert response.status_code == 400
    assert "Name the canaries" in text(response)
    assert not Rollout.objects.exists()
