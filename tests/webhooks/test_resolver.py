"""Looking up an endpoint's host: once per admin save (a resolver answering
otherwise the second time never turns a save into a 500), and bounded — a resolver
that hangs costs a registration or a delivery BELLWETHER_WEBHOOK_RESOLVE_TIMEOUT_S,
not the request or the worker (docs/security.md, "Webhooks")."""

import socket
import threading
import time

import pytest

from apps.audit.models import Action, AuditEvent
from apps.core.errors import ValidationFailed
from apps.core.events import announce
from apps.webhooks import services, tasks, transport
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

ADD = "/admin/webhooks/webhookendpoint/add/"
HOOKS = "/api/v1/environments/shop/prod/webhooks"
EVENTS = ["rollout.started"]
NAME = "hooks.example.net"
WAIT_S = 0.3


class Resolver:
    """socket.getaddrinfo for NAME answering each lookup in turn from `answers` (the
    last repeats): a list of addresses, an exception to raise, or "hang" (block
    until the test ends). Other names resolve as usual."""

    def __init__(self, real):
        self.real, self.answers, self.lookups = real, [], 0
        self.released = threading.Event()

    def __call__(self, host, port, *args, **kwargs):
        if host.rstrip(".") != NAME:
            return self.real(host, port, *args, **kwargs)
        self.lookups += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer == "hang":
            self.released.wait(30)
            raise socket.gaierror(socket.EAI_AGAIN, "hung lookup released")
        if isinstance(answer, Exception):
            raise answer
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, port)) for a in answer]


@pytest.fixture
def resolver(monkeypatch, settings):
    """The resolver of apps.webhooks.transport (through socket.getaddrinfo), private
    addresses refused as in production, lookups given up after WAIT_S."""
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": False,
                                    "resolve_timeout_s": WAIT_S}
    fake = Resolver(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    yield fake
    fake.released.set()  # hung lookups end with the test


@pytest.fixture
def admin_client(client, superuser):
    client.force_login(superuser)
    return client


def _add(client, environment, url=f"https://{NAME}/x"):
    return client.post(ADD, {"environment": environment.pk, "url": url, "events": EVENTS,
                             "description": "", "enabled": "on"})


# --- one lookup per admin save ------------------------------------------------------------


@pytest.mark.parametrize("second", [["127.0.0.1"], socket.gaierror(socket.EAI_NONAME, "gone")])
def test_an_admin_save_resolves_once_whatever_a_second_lookup_would_answer(
        admin_client, environment, resolver, second):
    resolver.answers = [["93.184.216.34"], second]
    response = _add(admin_client, environment)
    assert response.status_code == 302, response.content[:2000]
    assert resolver.lookups == 1
    assert WebhookEndpoint.objects.get().url == f"https://{NAME}/x"
    assert AuditEvent.objects.filter(action=Action.WEBHOOK_CREATE).count() == 1


@pytest.mark.parametrize("first", [socket.gaierror(socket.EAI_NONAME, "not yet"), "hang"])
def test_an_admin_save_of_a_name_not_resolving_yet_is_saved_and_checked_at_delivery(
        admin_client, environment, resolver, first):
    resolver.answers = [first, ["127.0.0.1"]]
    response = _add(admin_client, environment)
    assert response.status_code == 302, response.content[:2000]
    assert resolver.lookups == 1 and WebhookEndpoint.objects.count() == 1


def test_an_admin_save_of_a_name_resolving_to_a_private_address_is_a_form_error(
        admin_client, environment, resolver):
    resolver.answers = [["10.0.0.7"], ["93.184.216.34"]]
    response = _add(admin_client, environment)
    assert response.status_code == 200
    assert "resolves to 10.0.0.7" in response.content.decode()
    assert resolver.lookups == 1 and not WebhookEndpoint.objects.exists()


def test_an_admin_change_resolves_once_too(admin_client, environment, resolver, superuser):
    resolver.answers = [["93.184.216.34"]]
    endpoint, _ = services.endpoint_create(environment=environment, url=f"https://{NAME}/x",
                                           events=EVENTS, actor=superuser)
    resolver.answers, resolver.lookups = [["93.184.216.34"], ["127.0.0.1"]], 0
    response = admin_client.post(f"/admin/webhooks/webhookendpoint/{endpoint.pk}/change/", {
        "url": f"https://{NAME}/y", "events": EVENTS, "description": "", "enabled": "on"})
    assert response.status_code == 302, response.content[:2000]
    assert resolver.lookups == 1 and WebhookEndpoint.objects.get().url == f"https://{NAME}/y"


def test_the_service_still_checks_a_url_nobody_checked(environment, resolver, superuser):
    resolver.answers = [["127.0.0.1"]]
    with pytest.raises(ValidationFailed) as refused:
        services.endpoint_create(environment=environment, url=f"https://{NAME}/x",
                                 events=EVENTS, actor=superuser)
    assert refused.value.details[0]["field"] == "url"


# --- a resolver that hangs ----------------------------------------------------------------


def test_a_lookup_is_given_up_after_the_wait(resolver):
    resolver.answers = ["hang"]
    started = time.monotonic()
    with pytest.raises(transport.ResolveTimeout, match="did not answer within 0.3 s"):
        transport.resolve(NAME, 443, wait_s=WAIT_S)
    assert time.monotonic() - started < WAIT_S + 1


def test_registration_through_a_hanging_resolver_is_accepted_within_the_wait(
        client_for, environment, resolver):
    resolver.answers = ["hang"]
    started = time.monotonic()
    response = client_for("owner").post(HOOKS, {"url": f"https://{NAME}/x", "events": EVENTS},
                                        format="json")
    assert response.status_code == 201, response.content
    assert time.monotonic() - started < WAIT_S + 2
    assert resolver.lookups == 1


def test_a_delivery_through_a_hanging_resolver_fails_the_attempt_and_is_retried(
        environment, resolver, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "backoff_s": 60}
    resolver.answers = ["hang"]
    endpoint = WebhookEndpoint.objects.create(environment=environment, url=f"https://{NAME}/x",
                                              events=EVENTS, secret="whsec_test")
    announce("rollout.started", environment_id=environment.pk, rollout=1)
    started = time.monotonic()
    tasks.webhook_deliver_task.delay(endpoint.pk)
    assert time.monotonic() - started < WAIT_S + 2
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (delivery.state, delivery.attempts) == ("pending", 1)  # due again, not refused
    assert "cannot resolve the host" in delivery.last_error
    assert "did not answer within 0.3 s" in delivery.last_error


def test_lookups_still_hanging_past_the_bound_give_up_new_ones_at_once(resolver, monkeypatch):
    monkeypatch.setattr(transport, "MAX_PENDING_LOOKUPS", 1)
    monkeypatch.setattr(transport, "_pending_lookups", threading.BoundedSemaphore(1))
    resolver.answers = ["hang"]
    with pytest.raises(transport.ResolveTimeout):
        transport.resolve(NAME, 443, wait_s=WAIT_S)
    started = time.monotonic()
    with pytest.raises(transport.ResolveTimeout, match="not been answered yet"):
        transport.resolve(NAME, 443, wait_s=WAIT_S)
    assert time.monotonic() - started < WAIT_S and resolver.lookups == 1  # no new thread
    resolver.answers = [["93.184.216.34"]]
    resolver.released.set()  # the hung lookup ends and frees its place
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            assert transport.resolve(NAME, 443, wait_s=WAIT_S) == ["93.184.216.34"]
            break
        except transport.ResolveTimeout:
            time.sleep(0.05)
    else:
        pytest.fail("the place of the hung lookup was never freed")
