"""API throttling: per user, per agent and per client address, answering 429 with the
error envelope and Retry-After; agents at their normal poll rate are never refused;
a cache that is down throttles nobody rather than failing requests."""

from ipaddress import ip_network
from unittest import mock

import pytest
from django.test import override_settings

from apps.core import throttling
from tests.api_helpers import assert_error
from tests.factories import DESIRED, api_client_for, enrolled_agents, enrollment_token, poll

pytestmark = pytest.mark.django_db

ENVIRONMENTS = "/api/v1/environments"
ENROLL = "/api/v1/agent/enroll"
REPORTS = "/api/v1/agent/reports"
DEFAULT_RATES = {"user": "1200/minute", "agent": "600/minute", "anon": "300/minute"}


@pytest.fixture(autouse=True)
def _fresh_throttles(empty_cache):
    """Throttle history lives in the cache: every test starts with none."""


def _rates(**rates):
    return override_settings(BELLWETHER_THROTTLE_RATES={**DEFAULT_RATES, **rates})


def _throttled(response) -> int:
    error = assert_error(response, 429, "throttled")
    assert "throttled" in error["message"].lower()
    wait = int(response["Retry-After"])
    assert 1 <= wait <= 60
    return wait


def test_a_user_over_their_rate_gets_429_with_the_envelope_and_retry_after(member):
    client = api_client_for(member("viewer"))
    with _rates(user="3/minute"):
        answers = [client.get(ENVIRONMENTS) for _ in range(4)]

    assert [a.status_code for a in answers[:3]] == [200, 200, 200]
    _throttled(answers[3])


def test_each_user_has_a_rate_of_their_own(member):
    busy, other = api_client_for(member("viewer")), api_client_for(member("deployer"))
    with _rates(user="2/minute"):
        for _ in range(3):
            busy.get(ENVIRONMENTS)
        assert other.get(ENVIRONMENTS).status_code == 200
        _throttled(busy.get(ENVIRONMENTS))


def test_one_token_or_another_of_the_same_user_share_the_rate(member):
    user = member("viewer")
    first, second = api_client_for(user), api_client_for(user)
    with _rates(user="2/minute"):
        first.get(ENVIRONMENTS)
        first.get(ENVIRONMENTS)
        _throttled(second.get(ENVIRONMENTS))


@pytest.mark.slow  # minutes of polls
def test_an_agent_polling_every_second_for_minutes_is_never_refused(first, environment):
    """A minute of polls at the fastest interval tests use (1 s; the
    server allows no less than 5 s), each with a report, at the default rates."""
    node, = enrolled_agents(environment, 1)
    client = node.client
    with _rates():
        answers = [poll(client) for _ in range(60)]
        reports = [client.post(REPORTS, {"snapshot": first.number, "checksum": first.checksum,
                                         "status": "succeeded", "message": f"cycle {i}"},
                               format="json") for i in range(60)]

    assert {a.status_code for a in answers} <= {200, 304}
    assert all(r.status_code < 400 for r in reports), {r.status_code for r in reports}


def test_an_agent_over_its_rate_gets_429_and_another_agent_does_not(environment, first):
    greedy, calm = enrolled_agents(environment, 2)
    with _rates(agent="2/minute"):  # no If-None-Match: every poll is the database's
        answers = [greedy.client.get(DESIRED) for _ in range(3)]
        assert calm.client.get(DESIRED).status_code == 200

    assert [a.status_code for a in answers[:2]] == [200, 200]
    _throttled(answers[2])


def test_an_agents_rate_is_not_a_users_rate(environment, first, member):
    node, = enrolled_agents(environment, 1)
    user = api_client_for(member("viewer"))
    with _rates(user="1/minute"):
        user.get(ENVIRONMENTS)
        assert node.client.post(REPORTS, {"snapshot": first.number, "checksum": first.checksum,
                                          "status": "succeeded"},
                                format="json").status_code < 400
        _throttled(user.get(ENVIRONMENTS))


def _enroll(client, secret, name, **headers):
    return client.post(ENROLL, {"enrollment_token": secret, "name": name}, format="json",
                       **headers)


def test_enrollment_is_throttled_per_client_address_and_x_forwarded_for_is_ignored(
        environment):
    _, secret = enrollment_token(environment, uses=10)
    client = api_client_for()
    with _rates(anon="2/minute"):
        answers = [_enroll(client, secret, f"web-{i}", HTTP_X_FORWARDED_FOR=f"10.0.0.{i}")
                   for i in range(3)]

    assert [a.status_code for a in answers[:2]] == [201, 201]
    _throttled(answers[2])


@override_settings(BELLWETHER_PROXY_COUNT=1)
def test_behind_a_proxy_the_address_it_appended_is_the_client(environment):
    _, secret = enrollment_token(environment, uses=10)
    client = api_client_for()
    with _rates(anon="1/minute"):
        # The client wrote the first entry; the proxy appended the address it saw.
        first = _enroll(client, secret, "a", HTTP_X_FORWARDED_FOR="1.1.1.1, 10.0.0.1")
        spoofed = _enroll(client, secret, "b", HTTP_X_FORWARDED_FOR="2.2.2.2, 10.0.0.1")
        other = _enroll(client, secret, "c", HTTP_X_FORWARDED_FOR="10.0.0.2")

    assert first.status_code == 201
    _throttled(spoofed)
    assert other.status_code == 201


def test_a_rate_set_off_throttles_nobody(member):
    client = api_client_for(member("viewer"))
    with _rates(user=None):
        assert {client.get(ENVIRONMENTS).status_code for _ in range(5)} == {200}


def test_a_cache_that_is_down_throttles_nobody_and_fails_nothing(member):
    client = api_client_for(member("viewer"))
    with _rates(user="1/minute"), mock.patch.object(
            throttling._ScopedRateThrottle, "cache", mock.Mock(
                get=mock.Mock(side_effect=ConnectionError("cache down")))):
        assert {client.get(ENVIRONMENTS).status_code for _ in range(3)} == {200}


@pytest.mark.parametrize(("forwarded", "count", "expected"), [
    (None, 0, "192.0.2.9"),
    ("203.0.113.5", 0, "192.0.2.9"),
    ("203.0.113.5", 1, "203.0.113.5"),
    ("evil, 203.0.113.5", 1, "203.0.113.5"),
    ("evil, 203.0.113.5, 10.0.0.1", 2, "203.0.113.5"),
    ("203.0.113.5", 3, "203.0.113.5"),
    ("", 1, "192.0.2.9"),
])
def test_the_client_address_believes_only_the_proxies_entries(rf, forwarded, count, expected):
    headers = {"REMOTE_ADDR": "192.0.2.9"}
    if forwarded is not None:
        headers["HTTP_X_FORWARDED_FOR"] = forwarded
    with override_settings(BELLWETHER_PROXY_COUNT=count,
                           BELLWETHER_TRUSTED_PROXIES=[ip_network("192.0.2.0/24")]):
        assert throttling.client_ip(rf.get("/", **headers)) == expected


@pytest.mark.parametrize("peer", ["203.0.113.7", "2001:db8::7", "", "not-an-address"])
def test_a_client_reaching_the_node_directly_cannot_claim_an_address(rf, peer):
    request = rf.get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR="127.0.0.1")
    with override_settings(BELLWETHER_PROXY_COUNT=1):  # default: private networks only
        assert throttling.client_ip(request) == peer


@pytest.mark.parametrize("peer", ["127.0.0.1", "10.1.2.3", "172.20.0.5", "192.168.1.1", "::1",
                                  "fd00::5"])
def test_a_proxy_on_a_private_network_is_believed_by_default(rf, peer):
    request = rf.get("/", REMOTE_ADDR=peer, HTTP_X_FORWARDED_FOR="203.0.113.5")
    with override_settings(BELLWETHER_PROXY_COUNT=1):
        assert throttling.client_ip(request) == "203.0.113.5"
