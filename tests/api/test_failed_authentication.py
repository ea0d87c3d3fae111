"""Failed API authentications are throttled per client address: once an address has
had BELLWETHER_THROTTLE_RATES["failed_auth"] answers 401 to a credential it presented
(bad, unknown or revoked user, agent and enrollment tokens, on the cached poll path
too) within the window, it is answered 429 with the envelope and Retry-After until the window ends,
before any token is looked up. Other addresses, and successes, are not slowed; a
cache that is down counts nothing and is not waited on."""

from unittest import mock

import pytest
from django.core.cache import cache
from django.test import override_settings

from apps.core import throttling
from apps.core.breaker import best_effort_redis
from apps.fleet import enrollment
from apps.tenancy.services import api_token_revoke
from tests.api_helpers import assert_error
from tests.factories import (
    DESIRED,
    api_client_for,
    api_token,
    bearer_client,
    enrolled_agents,
    enrollment_token,
)

pytestmark = pytest.mark.django_db

ENVIRONMENTS = "/api/v1/environments"
ENROLL = "/api/v1/agent/enroll"
UNKNOWN_USER_TOKEN = "bwu_0123456789ab.not-the-secret"
UNKNOWN_AGENT_TOKEN = "bwa_0123456789ab.not-the-secret"
ATTACKER, OTHER = "203.0.113.66", "198.51.100.7"


@pytest.fixture(autouse=True)
def _fresh_counts(empty_cache):
    """The counts live in the cache: every test starts with none."""


def _bound(limit: int = 3):
    return override_settings(BELLWETHER_THROTTLE_RATES={
        "user": None, "agent": None, "anon": None, "failed_auth": f"{limit}/minute"})


def _refused(response) -> int:
    error = assert_error(response, 429, "throttled")
    assert "failed authentications" in error["message"]
    wait = int(response["Retry-After"])
    assert 1 <= wait <= 60
    return wait


def test_after_the_bound_of_bad_tokens_the_address_gets_429_before_any_lookup(
        django_assert_num_queries):
    client = bearer_client(UNKNOWN_USER_TOKEN)
    with _bound(3):
        answers = [client.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER) for _ in range(3)]
        with django_assert_num_queries(0):
            refused = client.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER)

    assert [a.status_code for a in answers] == [401, 401, 401]
    _refused(refused)


def test_a_good_token_from_another_address_is_unaffected_and_from_the_same_one_refused(
        member):
    bad, good = bearer_client(UNKNOWN_USER_TOKEN), api_client_for(member("viewer"))
    with _bound(2):
        for _ in range(2):
            bad.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER)
        elsewhere = good.get(ENVIRONMENTS, REMOTE_ADDR=OTHER)
        same = good.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER)

    assert elsewhere.status_code == 200
    _refused(same)


def test_successes_and_other_refusals_are_not_counted(member, environment):
    good = api_client_for(member("viewer"))
    with _bound(2):
        answers = [good.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER) for _ in range(5)]
        answers += [good.get(f"{ENVIRONMENTS}/nope/nothing", REMOTE_ADDR=ATTACKER)
                    for _ in range(3)]
        answers += [good.delete(f"{ENVIRONMENTS}/{environment.pk}", REMOTE_ADDR=ATTACKER)
                    for _ in range(3)]

    assert all(a.status_code != 429 for a in answers), [a.status_code for a in answers]
    assert {a.status_code for a in answers[:5]} == {200}


def _revoked_user_token(member):
    token, secret = api_token(member("viewer"))
    api_token_revoke(token=token, actor=token.user)
    return bearer_client(secret).get, ENVIRONMENTS


def _revoked_agent_token(environment):
    node, = enrolled_agents(environment, 1)
    enrollment.agent_token_revoke(agent=node.agent, actor=None)
    return node.client.get, DESIRED


@pytest.mark.parametrize("kind", ["unknown user token", "malformed token",
                                  "unknown agent token", "revoked user token",
                                  "revoked agent token", "bad enrollment token"])
def test_every_kind_of_failed_authentication_counts(kind, member, environment):
    if kind == "revoked user token":
        send, path = _revoked_user_token(member)
    elif kind == "revoked agent token":
        send, path = _revoked_agent_token(environment)
    elif kind == "bad enrollment token":
        def send(path, **extra):
            return api_client_for().post(path, {"enrollment_token": "bwe_0123456789ab.x",
                                                "name": "web-1"}, format="json", **extra)
        path = ENROLL
    else:
        token = {"unknown user token": UNKNOWN_USER_TOKEN, "malformed token": "bwu_\x7f",
                 "unknown agent token": UNKNOWN_AGENT_TOKEN}[kind]
        send = bearer_client(token).get
        path = DESIRED if kind == "unknown agent token" else ENVIRONMENTS
    with _bound(2):
        answers = [send(path, REMOTE_ADDR=ATTACKER) for _ in range(3)]

    assert [a.status_code for a in answers[:2]] == [401, 401]
    _refused(answers[2])


@pytest.mark.parametrize("path", [ENVIRONMENTS, DESIRED, "/api/v1/agent/drift",
                                  "/api/v1/nothing-here"])
def test_requests_without_a_credential_are_refused_but_never_counted(path, member):
    """Any web page can make a browser behind a NAT send credential-less requests
    (an <img>): they must not lock out the agents and people at that address."""
    anonymous = api_client_for()
    with _bound(3):
        answers = [anonymous.get(path, REMOTE_ADDR=ATTACKER,
                                 HTTP_ORIGIN="http://evil.example") for _ in range(61)]
        answers.append(anonymous.post(path, {}, format="json", REMOTE_ADDR=ATTACKER))
        good = api_client_for(member("viewer")).get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER)

    assert 429 not in {a.status_code for a in answers}
    assert good.status_code == 200
    assert throttling.blocked_addresses.wait(ATTACKER, 0) is None


@pytest.mark.parametrize("header", ["Bearer", "Basic Zm9vOmJhcg==", "Token x"])
def test_any_authorization_header_that_fails_counts(header):
    client = api_client_for()
    with _bound(2):
        answers = [client.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER, HTTP_AUTHORIZATION=header)
                   for _ in range(3)]

    assert [a.status_code for a in answers[:2]] == [401, 401]
    _refused(answers[2])


def test_an_enrollment_with_a_malformed_body_is_not_a_credential(environment):
    client = api_client_for()
    with _bound(2):
        answers = [client.post(ENROLL, {"name": "web-1"}, format="json", REMOTE_ADDR=ATTACKER)
                   for _ in range(4)]

    assert {a.status_code for a in answers} == {400}


def _poll(client, address: str, etag: str | None = None):
    headers = {"HTTP_IF_NONE_MATCH": etag} if etag else {}
    return client.get(DESIRED, REMOTE_ADDR=address, **headers)


def test_the_cached_poll_path_counts_bad_secrets_and_then_refuses_without_reading_it(
        environment, first):
    node, = enrolled_agents(environment, 1)
    etag = _poll(node.client, OTHER)["ETag"]
    with mock.patch("agentapi.desired.desired_answer") as view:
        assert _poll(node.client, OTHER, etag).status_code == 304  # from the cache
    view.assert_not_called()
    key = node.token.partition(".")[0]
    forged = bearer_client(f"{key}.a-guessed-secret")
    with _bound(3):
        answers = [_poll(forged, ATTACKER, etag) for _ in range(3)]
        with mock.patch("apps.fleet.cache.poll_state") as cache_read:
            refused = _poll(node.client, ATTACKER, etag)
        assert _poll(node.client, OTHER, etag).status_code == 304

    assert [a.status_code for a in answers] == [401, 401, 401]
    _refused(refused)
    cache_read.assert_not_called()


def test_enrollment_with_a_good_token_from_another_address_still_enrolls(environment):
    _, secret = enrollment_token(environment, uses=1)
    client = api_client_for()
    with _bound(2):
        for _ in range(2):
            client.post(ENROLL, {"enrollment_token": "bwe_0123456789ab.x", "name": "x"},
                        format="json", REMOTE_ADDR=ATTACKER)
        refused = client.post(ENROLL, {"enrollment_token": secret, "name": "web-1"},
                              format="json", REMOTE_ADDR=ATTACKER)
        enrolled = client.post(ENROLL, {"enrollment_token": secret, "name": "web-1"},
                               format="json", REMOTE_ADDR=OTHER)

    _refused(refused)
    assert enrolled.status_code == 201


@override_settings(BELLWETHER_PROXY_COUNT=1)
def test_behind_a_proxy_a_forged_forwarded_address_does_not_escape():
    client = bearer_client(UNKNOWN_USER_TOKEN)
    with _bound(2):
        for forged in ("1.1.1.1", "2.2.2.2"):
            client.get(ENVIRONMENTS, HTTP_X_FORWARDED_FOR=f"{forged}, {ATTACKER}")
        refused = client.get(ENVIRONMENTS, HTTP_X_FORWARDED_FOR=f"3.3.3.3, {ATTACKER}")
        other = client.get(ENVIRONMENTS, HTTP_X_FORWARDED_FOR=OTHER)

    _refused(refused)
    assert other.status_code == 401


def test_a_cache_that_is_down_counts_nothing_and_is_not_waited_on_again():
    client = bearer_client(UNKNOWN_USER_TOKEN)
    down = mock.Mock(add=mock.Mock(side_effect=TimeoutError("stalled")))
    with _bound(2), mock.patch.object(throttling, "cache", down):
        answers = [client.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER) for _ in range(6)]

    assert {a.status_code for a in answers} == {401}
    assert down.add.call_count == 1  # the breaker skips the cache after its failure
    assert not best_effort_redis.allows()


def test_off_counts_nothing():
    client = bearer_client(UNKNOWN_USER_TOKEN)
    with override_settings(BELLWETHER_THROTTLE_RATES={"failed_auth": None}):
        answers = [client.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER) for _ in range(10)]
    assert {a.status_code for a in answers} == {401}
    assert cache.get(f"throttle_failed_auth_{ATTACKER}_0") is None


def test_the_address_is_let_in_again_when_its_window_ends():
    with _bound(2):
        throttling.authentication_failed(ATTACKER, now=600.5)
        assert throttling.blocked_addresses.wait(ATTACKER, 600.5) is None
        throttling.authentication_failed(ATTACKER, now=610.0)
        assert throttling.blocked_addresses.wait(ATTACKER, 610.0) == 50
        assert throttling.blocked_addresses.wait(ATTACKER, 659.5) == 1
        assert throttling.blocked_addresses.wait(ATTACKER, 660.0) is None
        # A new window counts from zero.
        throttling.authentication_failed(ATTACKER, now=661.0)
        assert throttling.blocked_addresses.wait(ATTACKER, 661.0) is None


def test_the_blocked_addresses_a_process_keeps_are_bounded(monkeypatch):
    blocked = throttling._BlockedAddresses()
    monkeypatch.setattr(throttling._BlockedAddresses, "MAX", 3)
    now = __import__("time").time()
    for index, until in enumerate((now + 30, now + 10, now + 20)):
        blocked.block(f"10.0.0.{index}", until)
    blocked.block("10.0.0.9", now + 40)

    assert blocked.wait("10.0.0.1", now) is None  # its block ended first: it made room
    assert [blocked.wait(f"10.0.0.{i}", now) is not None for i in (0, 2, 9)] == [True] * 3
