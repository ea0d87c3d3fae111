"""The poll edge (apps/fleet/edge.py): the agent poll's 304 answered on the event loop
in front of Django, and every request it must not answer handed to Django unchanged.

Django here is a stub that answers 599, so each test sees who answered; what Django
then answers (401 with the envelope, 200, 429, 400) is tests/fleet/test_desired.py's
and, through the production server, tests/e2e/test_production_server.py's."""

import asyncio
import time

import pytest
from django.test.utils import override_settings

from apps.core import throttling
from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, polldebt
from apps.fleet.edge import DESIRED_PATH, PollEdge
from tests.factories import poll

DJANGO = 599


async def _django(scope, receive, send):
    await send({"type": "http.response.start", "status": DJANGO, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def call_edge(*, headers=(), method="GET", path=DESIRED_PATH, query=b"", scheme="http",
              client=("10.0.0.7", 50000), kind="http"):
    """(status, headers) of the answer of PollEdge around the stub Django."""
    scope = {"type": kind, "method": method, "path": path, "query_string": query,
             "scheme": scheme, "client": client,
             "headers": [(n.lower().encode(), v.encode()) for n, v in headers]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(PollEdge(_django)(scope, receive, send))
    start = sent[0]
    return start["status"], {n.decode(): v.decode() for n, v in start["headers"]}


@pytest.fixture
def warm(enroll, first, monkeypatch):
    """An agent whose poll state is cached, with this process's poll debts read and
    its heartbeats flushed a moment ago: what a web node polled for a while looks like."""
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=lambda: 0.0))
    agent = enroll()
    response = poll(agent.client)
    assert response.status_code == 200
    fleet_cache._heartbeats._flushed_at = time.time()
    agent.etag = response["ETag"]
    agent.headers = [("Host", "testserver"), ("Authorization", f"Bearer {agent.token}")]
    return agent


@pytest.mark.parametrize("form", ["exact", "list", "star", "weak"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_matching_poll_is_304_from_the_edge_with_no_sql_and_a_heartbeat(
        warm, form, method, django_assert_num_queries):
    header = {"exact": warm.etag, "list": f'"nope", {warm.etag}', "star": "*",
              "weak": f"W/{warm.etag}"}[form]
    fleet_cache._heartbeats._pending.clear()

    with django_assert_num_queries(0):
        status, headers = call_edge(headers=[*warm.headers, ("If-None-Match", header)],
                                    method=method)

    assert (status, headers["etag"], headers["cache-control"]) == (304, warm.etag, "no-cache")
    assert warm.agent.pk in fleet_cache._heartbeats.pending()


@pytest.mark.parametrize("case", [
    "no If-None-Match", "another ETag", "a malformed If-None-Match", "an unterminated tag",
    "a query string", "POST", "another path", "If-Match", "If-Unmodified-Since",
    "Authorization twice", "If-None-Match twice", "no Authorization", "Basic", "a user token",
    "a wrong secret", "an unknown key", "a NUL in the token", "a host not allowed", "no Host",
])
def test_what_django_must_decide_goes_to_django(warm, case):
    auth = f"Bearer {warm.token}"
    key = warm.token.split(".")[0]
    headers = {"Host": "testserver", "Authorization": auth, "If-None-Match": warm.etag}
    extra, method, path, query = [], "GET", DESIRED_PATH, b""
    if case == "no If-None-Match":
        del headers["If-None-Match"]
    elif case == "another ETag":
        headers["If-None-Match"] = '"nope"'
    elif case == "a malformed If-None-Match":
        headers["If-None-Match"] = warm.etag.strip('"')
    elif case == "an unterminated tag":
        headers["If-None-Match"] = warm.etag[:-1]
    elif case == "a query string":
        query = b"x=1"
    elif case == "POST":
        method = "POST"
    elif case == "another path":
        path = DESIRED_PATH + "/"
    elif case == "If-Match":
        extra = [("If-Match", '"other"')]
    elif case == "If-Unmodified-Since":
        extra = [("If-Unmodified-Since", "Thu, 01 Jan 1970 00:00:00 GMT")]
    elif case == "Authorization twice":
        extra = [("Authorization", auth)]
    elif case == "If-None-Match twice":
        extra = [("If-None-Match", warm.etag)]
    elif case == "no Authorization":
        del headers["Authorization"]
    elif case == "Basic":
        headers["Authorization"] = "Basic " + warm.token
    elif case == "a user token":
        headers["Authorization"] = auth.replace("bwa_", "bwu_")
    elif case == "a wrong secret":
        headers["Authorization"] = f"Bearer {key}.{'x' * 43}"
    elif case == "an unknown key":
        headers["Authorization"] = auth.replace(key, "bwa_000000000000")
    elif case == "a NUL in the token":
        headers["Authorization"] = auth + "\x00"
    elif case == "a host not allowed":
        headers["Host"] = "evil.example"
    elif case == "no Host":
        del headers["Host"]

    status, _ = call_edge(headers=[*headers.items(), *extra], method=method, path=path,
                          query=query)

    assert status == DJANGO


def test_a_revoked_token_goes_to_django_on_its_next_poll(warm, superuser,
                                                         django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        enrollment.agent_token_revoke(agent=warm.agent, actor=superuser)

    status, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == DJANGO


def test_an_indebted_token_goes_to_django_whatever_the_cache_holds(warm, monkeypatch):
    """A change's PollInvalidation not yet settled: the cached ETag may be stale
    (its drop may have failed), so the database answers."""
    key = warm.token.removeprefix("bwa_").split(".")[0]
    monkeypatch.setattr(polldebt._debts, "_keys", frozenset({key}))

    status, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == DJANGO


def test_debts_due_for_their_refresh_send_the_poll_to_django(warm, monkeypatch):
    monkeypatch.setattr(polldebt._debts, "clock", lambda: 10.0)

    status, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == DJANGO


def test_a_heartbeat_flush_due_sends_the_poll_to_django(warm):
    fleet_cache._heartbeats._flushed_at = 0.0
    fleet_cache._heartbeats._pending.clear()

    status, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == DJANGO
    assert fleet_cache._heartbeats.pending() == {}  # Django's poll records (and flushes) it


def test_an_address_refused_for_failed_authentications_goes_to_django(warm):
    throttling.blocked_addresses.block("10.0.0.7", time.time() + 60)

    refused, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])
    other, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)],
                         client=("10.0.0.8", 1))

    assert (refused, other) == (DJANGO, 304)


@override_settings(BELLWETHER_PROXY_COUNT=1)
def test_the_refused_address_behind_a_proxy_is_the_forwarded_one(warm):
    throttling.blocked_addresses.block("203.0.113.9", time.time() + 60)
    headers = [*warm.headers, ("If-None-Match", warm.etag)]

    refused, _ = call_edge(headers=[*headers, ("X-Forwarded-For", "203.0.113.9")])
    other, _ = call_edge(headers=[*headers, ("X-Forwarded-For", "203.0.113.10")])

    assert (refused, other) == (DJANGO, 304)


@override_settings(SECURE_SSL_REDIRECT=True, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO",
                                                                      "https"))
def test_plain_http_goes_to_django_for_its_redirect_when_https_is_required(warm):
    headers = [*warm.headers, ("If-None-Match", warm.etag)]

    plain, _ = call_edge(headers=headers)
    https, _ = call_edge(headers=headers, scheme="https")
    proxied, _ = call_edge(headers=[*headers, ("X-Forwarded-Proto", "https")])

    assert (plain, https, proxied) == (DJANGO, 304, 304)


def test_a_cache_entry_gone_goes_to_django(warm):
    fleet_cache.forget_poll_states([warm.token.removeprefix("bwa_").split(".")[0]])

    status, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == DJANGO


def test_a_cache_down_goes_to_django(warm):
    with override_settings(CACHES={"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens here
    }}):
        status, _ = call_edge(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == DJANGO


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
def test_other_protocols_go_to_the_application(kind):
    status, _ = call_edge(kind=kind)

    assert status == DJANGO
