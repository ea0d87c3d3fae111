"""The webhook API: every route with a positive and a negative case; owners only; the
secret in the creating (and rotating) answer only; bad input 400 naming the field
with nothing written; every change audited."""

import pytest
from rest_framework.test import APIClient

from apps.audit.models import Action, AuditEvent
from apps.core.events import announce
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

HOOKS = "/api/v1/environments/shop/prod/webhooks"
BODY = {"url": "http://127.0.0.1:9/hook", "events": ["rollout.started", "approval.given"]}


def hook_url(endpoint_id: int, suffix: str = "") -> str:
    return f"/api/v1/webhooks/{endpoint_id}{suffix}"


@pytest.fixture
def owner(client_for, environment):
    return client_for("owner")


@pytest.fixture
def deployer(client_for, environment):
    return client_for("deployer")


@pytest.fixture
def stranger(outsider, api_client):
    return api_client(outsider)


@pytest.fixture
def created(owner):
    response = owner.post(HOOKS, BODY, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_an_owner_registers_an_endpoint_and_sees_its_secret_once(owner, created):
    assert created["secret"].startswith("whsec_")
    assert created["events"] == BODY["events"]
    assert AuditEvent.objects.filter(action=Action.WEBHOOK_CREATE,
                                     object_id=str(created["id"])).exists()
    listed = owner.get(HOOKS).json()["results"]
    assert [e["id"] for e in listed] == [created["id"]]
    assert "secret" not in listed[0]
    assert "secret" not in owner.get(hook_url(created["id"])).json()
    assert created["secret"] not in str(AuditEvent.objects.values_list("data", flat=True))


@pytest.mark.parametrize("body, field", [
    ({**BODY, "url": "ftp://example.com/"}, "url"),
    ({**BODY, "events": ["rollout.exploded"]}, "events"),
    ({**BODY, "events": []}, "events"),
    ({"events": BODY["events"]}, "url"),
])
def test_bad_input_is_400_naming_the_field(owner, environment, body, field):
    error = assert_error(owner.post(HOOKS, body, format="json"), 400)
    assert field in str(error["details"]), error
    assert not WebhookEndpoint.objects.exists()


def test_a_private_address_is_refused_without_the_setting(owner, environment, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": False}
    error = assert_error(owner.post(HOOKS, BODY, format="json"), 400)
    assert error["details"][0]["field"] == "url"


def test_only_owners_see_or_register_endpoints(deployer, stranger, created):
    assert_error(deployer.post(HOOKS, BODY, format="json"), 403)
    assert_error(deployer.get(HOOKS), 403)
    assert_error(stranger.get(HOOKS), 404)
    assert_error(APIClient().get(HOOKS), 401)
    for client, status in ((deployer, 403), (stranger, 404)):
        assert_error(client.get(hook_url(created["id"])), status)
        assert_error(client.patch(hook_url(created["id"]), {"enabled": False},
                                  format="json"), status)
        assert_error(client.delete(hook_url(created["id"])), status)
        assert_error(client.post(hook_url(created["id"], "/rotate-secret")), status)
        assert_error(client.get(hook_url(created["id"], "/deliveries")), status)
    assert WebhookEndpoint.objects.get().enabled


def test_an_owner_changes_an_endpoint(owner, created):
    response = owner.patch(hook_url(created["id"]), {"enabled": False,
                                                     "events": ["drift.reported"]},
                           format="json")
    assert response.status_code == 200, response.content
    assert (response.json()["enabled"], response.json()["events"]) == (False,
                                                                      ["drift.reported"])
    assert AuditEvent.objects.filter(action=Action.WEBHOOK_UPDATE).count() == 1


def test_a_bad_change_is_400_and_changes_nothing(owner, created):
    assert_error(owner.patch(hook_url(created["id"]), {"url": "gopher://x"},
                             format="json"), 400)
    assert_error(owner.patch(hook_url(created["id"]), {"enabled": "perhaps"},
                             format="json"), 400)
    assert WebhookEndpoint.objects.get().url == BODY["url"]


def test_rotating_the_secret_shows_the_new_one_once(owner, created):
    response = owner.post(hook_url(created["id"], "/rotate-secret"))
    assert response.status_code == 200, response.content
    secret = response.json()["secret"]
    assert secret != created["secret"]
    assert WebhookEndpoint.objects.get().secret == secret
    assert_error(owner.post(hook_url(999_999, "/rotate-secret")), 404)


def test_the_delivery_log_is_listed_newest_first(owner, created, environment):
    announce("rollout.started", environment_id=environment.pk, rollout=1)
    announce("approval.given", environment_id=environment.pk, approval=7)
    response = owner.get(hook_url(created["id"], "/deliveries"))
    assert response.status_code == 200, response.content
    rows = response.json()["results"]
    assert [(r["sequence"], r["event"], r["state"]) for r in rows] == [
        (2, "approval.given", "pending"), (1, "rollout.started", "pending")]
    assert_error(owner.get(hook_url(999_999, "/deliveries")), 404)


def test_an_owner_deletes_an_endpoint_with_its_log(owner, created, environment):
    announce("rollout.started", environment_id=environment.pk, rollout=1)
    assert owner.delete(hook_url(created["id"])).status_code == 204
    assert not WebhookEndpoint.objects.exists() and not WebhookDelivery.objects.exists()
    assert AuditEvent.objects.filter(action=Action.WEBHOOK_DELETE).exists()
    assert_error(owner.delete(hook_url(created["id"])), 404)


def test_an_environment_has_a_bounded_number_of_endpoints(owner, environment, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "max_endpoints": 1}
    assert owner.post(HOOKS, BODY, format="json").status_code == 201
    assert_error(owner.post(HOOKS, BODY, format="json"), 409, "too_many_endpoints")
