"""Hostile webhook URLs end to end: refused at registration through every surface
(400 naming `url`, nothing written) with each address a name resolves to checked;
refused again at delivery (a row written before a rule, a name that resolves
elsewhere now), the connection going to the very address checked; and no URL's
path, query or credentials in the audit log that deployers and viewers read."""

import importlib

import pytest
from django.apps import apps as django_apps

from apps.audit.models import Action, AuditEvent
from apps.core.events import announce
from apps.webhooks import services, tasks
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint
from tests.api_helpers import assert_error
from tests.factories import session_client

pytestmark = pytest.mark.django_db

HOOKS = "/api/v1/environments/shop/prod/webhooks"
EVENTS = ["rollout.started"]
SECRET = "sEcReT-7f3a"
SECRET_URL = f"https://{SECRET}:{SECRET}@hooks.example.net/services/{SECRET}?token={SECRET}"


@pytest.fixture
def strict(settings):
    """Private addresses refused, as in production."""
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": False}


@pytest.fixture
def owner(client_for, environment):
    return client_for("owner")


@pytest.mark.parametrize("url", ["https://hooks.example.net/x\r\nX-Injected: 1",
                                 "https://hooks.example.net/x\n", "\thttps://hooks.example.net/",
                                 "https://hooks.example.net/x y", "https://hooks.exa\x00mple.net/",
                                 "https://hooks.example.net/\u2028", " https://hooks.example.net/",
                                 "https://hooks.example.net/x\u202e"])
@pytest.mark.parametrize("allow_private", [False, True])
def test_the_api_refuses_control_characters_and_whitespace_naming_url(
        owner, settings, url, allow_private):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS,
                                    "allow_private": allow_private}
    error = assert_error(owner.post(HOOKS, {"url": url, "events": EVENTS}, format="json"), 400)
    assert error["details"][0]["field"] == "url"  # NUL is refused before the rule, as any
    assert not WebhookEndpoint.objects.exists()


def test_a_change_to_a_url_with_a_line_break_is_refused(owner):
    created = owner.post(HOOKS, {"url": "http://127.0.0.1:9/hook", "events": EVENTS},
                         format="json").json()
    error = assert_error(owner.patch(f"/api/v1/webhooks/{created['id']}",
                                     {"url": "http://127.0.0.1:9/hook\r\n"}, format="json"), 400)
    assert error["details"][0]["field"] == "url"
    assert WebhookEndpoint.objects.get().url == "http://127.0.0.1:9/hook"


@pytest.mark.parametrize("url", ["http://2130706433/", "http://0x7f.1/", "http://017700000001/",
                                 "http://[64:ff9b::7f00:1]/", "http://[2002:a9fe:a9fe::]/",
                                 "http://[::ffff:169.254.169.254]/", "http://localhost./",
                                 "http://127.0.0.1./", "http://[fd00::1]/", "http://[ff02::1]/"])
def test_the_api_refuses_every_spelling_of_an_internal_address(owner, strict, url):
    error = assert_error(owner.post(HOOKS, {"url": url, "events": EVENTS}, format="json"), 400)
    assert error["details"][0]["field"] == "url"
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.parametrize("addresses", [["93.184.216.34", "10.0.0.7"], ["127.0.0.1"],
                                       ["64:ff9b::a9fe:a9fe"], ["2002:7f00:1::"],
                                       ["::ffff:10.0.0.1"], ["fe80::1%eth0"], ["fd00::5"],
                                       ["2001:0:4136:e378:8000:63bf:3fff:fdd2"]])
def test_a_name_resolving_to_any_internal_address_is_refused_at_registration(
        owner, strict, dns, addresses):
    dns.answer("hooks.example.net", addresses)
    error = assert_error(owner.post(HOOKS, {"url": "https://hooks.example.net./x",
                                            "events": EVENTS}, format="json"), 400)
    assert error["details"][0]["field"] == "url"
    assert "resolves to" in error["details"][0]["message"]
    assert not WebhookEndpoint.objects.exists()


def test_a_name_resolving_to_public_addresses_or_not_yet_resolving_is_accepted(
        owner, strict, dns):
    dns.answer("hooks.example.net", ["93.184.216.34", "2606:4700::1111", "64:ff9b::808:808"])
    assert owner.post(HOOKS, {"url": "https://hooks.example.net/x", "events": EVENTS},
                      format="json").status_code == 201
    # RFC 6761: never resolves. Every delivery resolves and checks it again.
    assert owner.post(HOOKS, {"url": "https://hooks.bellwether.invalid/x", "events": EVENTS},
                      format="json").status_code == 201


def test_the_dashboard_refuses_a_url_with_a_line_break(member, environment):
    client = session_client(member("owner"))
    response = client.post(f"/e/{environment.application.name}/{environment.name}/webhooks/",
                           {"url": "http://127.0.0.1:9/hook\r\n", "events": EVENTS})
    assert response.status_code == 400
    assert not WebhookEndpoint.objects.exists()


# --- at delivery ----------------------------------------------------------------------------


def _stored(environment, url: str) -> WebhookEndpoint:
    """An endpoint row written as it may have been before a rule existed."""
    endpoint = WebhookEndpoint.objects.create(environment=environment, url=url, events=EVENTS,
                                              secret="whsec_test")
    announce("rollout.started", environment_id=environment.pk, rollout=1)
    return endpoint


def _to(dns, url: str) -> list:
    """The connections made to the receiver's port (Redis and others aside)."""
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    return [address for address in dns.connections if address[1] == port]


def _delivered(endpoint) -> WebhookDelivery:
    tasks.webhook_deliver_task.delay(endpoint.pk)
    return WebhookDelivery.objects.get(endpoint=endpoint)


@pytest.mark.parametrize("path", ["/hook\r\nX-Injected: 1", "/hook\n", "/ho ok", "/hook\x01",
                                  "/hook\x7f", "/h\u00e9"])
def test_a_stored_url_with_a_control_character_is_refused_at_delivery(
        environment, receiver, path):
    live, url = receiver
    delivery = _delivered(_stored(environment, url.replace("/hook", path)))
    assert live.received == []
    assert (delivery.state, delivery.attempts) == ("failed", 1)
    assert "control characters" in delivery.last_error


@pytest.mark.parametrize("host", ["2130706433", "0x7f.1", "127.1", "017700000001"])
def test_a_stored_url_with_another_spelling_of_an_address_is_refused_at_delivery(
        environment, receiver, host):
    live, url = receiver
    delivery = _delivered(_stored(environment, url.replace("127.0.0.1", host)))
    assert live.received == [] and delivery.state == "failed"
    assert "IPv4" in delivery.last_error


def test_a_name_that_resolves_to_an_internal_address_by_delivery_time_is_refused(
        environment, receiver, superuser, dns, strict):
    live, url = receiver
    # Public when registered; loopback (a DNS rebinding) when delivered.
    dns.answer("rebind.example.net", ["93.184.216.34"], ["127.0.0.1"])
    endpoint, _ = services.endpoint_create(
        environment=environment, url=url.replace("127.0.0.1", "rebind.example.net"),
        events=EVENTS, actor=superuser)
    announce("rollout.started", environment_id=environment.pk, rollout=1)
    delivery = _delivered(endpoint)
    assert live.received == [] and _to(dns, url) == []
    assert (delivery.state, delivery.attempts) == ("failed", 1)
    assert "resolves to 127.0.0.1" in delivery.last_error


def test_one_internal_address_among_public_ones_refuses_the_delivery(
        environment, receiver, dns, strict):
    live, url = receiver
    dns.answer("mixed.example.net", ["93.184.216.34", "64:ff9b::7f00:1"])
    delivery = _delivered(_stored(environment, url.replace("127.0.0.1", "mixed.example.net")))
    assert live.received == [] and _to(dns, url) == []
    assert "NAT64 form of 127.0.0.1" in delivery.last_error


def test_the_connection_goes_to_the_address_checked_not_a_second_lookup(
        environment, receiver, superuser, dns):
    live, url = receiver
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    # A second lookup would answer an address nothing listens on.
    dns.answer("pinned.example.net", ["127.0.0.1"], ["10.255.255.1"])
    endpoint, live.secret = services.endpoint_create(
        environment=environment, url=url.replace("127.0.0.1", "pinned.example.net"),
        events=EVENTS, actor=superuser)
    announce("rollout.started", environment_id=environment.pk, rollout=1)
    delivery = _delivered(endpoint)
    assert delivery.state == "succeeded" and live.received[0].signature_ok
    assert dns.lookups == ["pinned.example.net"]  # once: at delivery (private allowed)
    assert _to(dns, url) == [("127.0.0.1", port)]


# --- what the audit log shows ---------------------------------------------------------------


def test_the_audit_log_holds_no_path_query_or_credentials_of_a_url(
        owner, client_for, strict, dns):
    dns.answer("hooks.example.net", ["93.184.216.34"])
    body = {"url": f"https://hooks.example.net/services/{SECRET}?token={SECRET}",
            "events": EVENTS}
    created = owner.post(HOOKS, body, format="json").json()
    assert owner.get(f"/api/v1/webhooks/{created['id']}").json()["url"] == body["url"]
    owner.patch(f"/api/v1/webhooks/{created['id']}",
                {"url": f"https://hooks.example.net/v2/{SECRET}#{SECRET}"}, format="json")
    assert owner.delete(f"/api/v1/webhooks/{created['id']}").status_code == 204

    events = list(AuditEvent.objects.filter(action__startswith="webhook."))
    assert [e.action for e in events] == [Action.WEBHOOK_DELETE, Action.WEBHOOK_UPDATE,
                                          Action.WEBHOOK_CREATE]
    assert SECRET not in str([(e.summary, e.data, e.object_repr) for e in events])
    assert events[2].data["url"] == "https://hooks.example.net/…"
    readers = {role: client_for(role) for role in ("viewer", "deployer")}
    for reader in readers.values():
        response = reader.get("/api/v1/environments/shop/prod/audit")
        assert response.status_code == 200 and "hooks.example.net" in response.content.decode()
        assert SECRET not in response.content.decode()
    assert_error(readers["deployer"].get(HOOKS), 403)


def test_old_audit_events_of_webhooks_are_redacted_by_the_migration(environment):
    migration = importlib.import_module("apps.webhooks.migrations.0002_redact_audit_urls")
    old = [
        AuditEvent.objects.create(
            action=Action.WEBHOOK_CREATE, object_type="webhooks.webhookendpoint",
            object_id="4", object_repr=f"webhook 4 of 1 to {SECRET_URL[:80]}",
            environment=environment, summary=f"Webhook 4 to {SECRET_URL} for rollout.started",
            data={"url": SECRET_URL, "events": EVENTS}),
        AuditEvent.objects.create(
            action=Action.WEBHOOK_UPDATE, object_type="webhooks.webhookendpoint",
            object_id="4", object_repr=f"webhook 4 of 1 to {SECRET_URL[:80]}",
            environment=environment, summary="Webhook 4 changed: url",
            data={"url": "http://exa\r\nmple.com/" + SECRET}),
        AuditEvent.objects.create(
            action=Action.WEBHOOK_DELETE, object_type="webhooks.webhookendpoint",
            object_id="4", object_repr=f"webhook 4 of 1 to {SECRET_URL[:80]}",
            environment=environment, summary=f"Webhook 4 to {SECRET_URL} deleted"),
    ]
    migration.redact(django_apps, None)
    rows = {e.pk: e for e in AuditEvent.objects.filter(pk__in=[e.pk for e in old])}
    assert SECRET not in str([(e.summary, e.data, e.object_repr) for e in rows.values()])
    assert rows[old[0].pk].summary == "Webhook 4 to https://hooks.example.net/… for rollout.started"
    assert rows[old[0].pk].object_repr == "webhook 4 of 1 to https://hooks.example.net/…"
    assert rows[old[1].pk].data == {"url": "(a URL that does not parse)"}
    assert rows[old[2].pk].summary == "Webhook 4 to https://hooks.example.net/… deleted"
