"""The bundle edge (agentapi/bundle_edge.py): Django's answer to a bundle request,
kept and replayed in front of Django to the agents that may have it, byte for byte
and header for header; everything else handed to Django unchanged.

Django here is the test client (every middleware) behind an ASGI shim. The edge runs
under async_to_sync and its thread hops (and Django) through sync_to_async, so every
query, the edge's included, runs on the test's thread, in its transaction, counted
by django_assert_num_queries."""

import asyncio
import gzip
import json
import time

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.test import Client
from django.test.utils import override_settings

from agentapi import bundle_edge, longpoll
from agentapi.bundle_edge import Answer, BundleEdge
from apps.core import throttling
from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, polldebt
from apps.fleet.cache import forget_poll_states
from apps.releases import retention
from apps.releases import services as releases
from apps.releases.publishing import publication_abandon
from apps.releases.services import snapshot_publish
from apps.snapshots.models import Snapshot
from tests.agentroutes import DJANGO_ITSELF
from tests.factories import enrolled_agent, poll, publish_variant, rollback_publication
from tests.fleet.support import bundle_url


class DjangoByClient:
    """Django as an ASGI application, through the test client; counts its calls."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        response = await sync_to_async(self.answer)(scope)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": self.headers(response)})
        await send({"type": "http.response.body", "body": response.content})

    @staticmethod
    def answer(scope):
        return Client().generic(
            scope["method"], scope["path"], secure=scope["scheme"] == "https",
            QUERY_STRING=scope["query_string"].decode("latin-1"),
            headers={n.decode(): v.decode("latin-1") for n, v in scope["headers"]},
            **DJANGO_ITSELF)

    @staticmethod
    def headers(response):
        return [(n.encode(), v.encode("latin-1")) for n, v in response.items()] + [
            (b"set-cookie", c.output(header="").strip().encode())
            for c in response.cookies.values()]


async def _on_the_tests_thread(function, *args):
    return await sync_to_async(function)(*args)


@pytest.fixture
def django_app(monkeypatch):
    """The edge's reads on the test's thread (and connection), and an empty edge."""
    monkeypatch.setattr(asyncio, "to_thread", _on_the_tests_thread)
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=lambda: 0.0))
    bundle_edge.forget()
    yield DjangoByClient()
    bundle_edge.forget()


def sent(app, *, path=None, headers=(), method="GET", query=b"", scheme="http",
         client=("10.0.0.7", 50000), number=1):
    """(status, headers as sent, body) of BundleEdge around `app`."""
    scope = {"type": "http", "method": method, "path": path or bundle_url(number),
             "query_string": query, "scheme": scheme, "client": client,
             "headers": [(n.lower().encode(), v.encode()) for n, v in headers]}
    messages = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        messages.append(message)

    async_to_sync(BundleEdge(app))(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in messages[1:])
    return messages[0]["status"], list(messages[0]["headers"]), body


def per_request_removed(answer):
    """Django's answer without what belongs to its one request (its X-Request-ID),
    which the edge never replays."""
    status, headers, body = answer
    return status, [(n, v) for n, v in headers if n.lower() != b"x-request-id"], body


def named(headers) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in headers}


def error_code(answer) -> str:
    status, headers, body = answer
    assert named(headers)[b"content-type"] == b"application/json", headers
    return json.loads(body)["error"]["code"]


def polled(agent):
    """The agent after its first polls: its poll state is cached and the poll debts
    read, as on a web node."""
    etag = poll(agent.client)["ETag"]
    assert poll(agent.client, etag).status_code == 304
    agent.headers = [("Host", "testserver"), ("Authorization", f"Bearer {agent.token}"),
                     ("Accept-Encoding", "gzip")]
    return agent


@pytest.fixture
def agent(django_app, enroll, first):
    return polled(enroll())


def test_a_bundle_django_answered_is_replayed_byte_for_byte_with_no_sql(
        agent, first, django_app, django_assert_num_queries):
    with django_assert_num_queries(2):  # Django: the token, the snapshot
        from_django = sent(django_app, headers=agent.headers)
    with django_assert_num_queries(0):
        from_edge = sent(django_app, headers=agent.headers)

    assert django_app.calls == 1
    assert from_edge == per_request_removed(from_django)
    status, headers, body = from_edge
    assert (status, named(headers)[b"content-encoding"]) == (200, b"gzip")
    assert body == bytes(Snapshot.objects.get(pk=first.pk).bundle_gzip)
    assert gzip.decompress(body) == bytes(first.bundle)


def test_a_bundle_waits_for_the_polls_its_process_woke_before_it(agent, django_app):
    """After a publish the polls woken first are answered before the bundles their
    agents then ask for (agentapi.longpoll.woken_polls_first)."""
    sent(django_app, headers=agent.headers)  # Django's answer, kept by the edge
    scope = {"type": "http", "method": "GET", "path": bundle_url(1), "query_string": b"",
             "scheme": "http", "client": ("10.0.0.7", 50000),
             "headers": [(n.lower().encode(), v.encode()) for n, v in agent.headers]}

    async def scenario():
        messages = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            messages.append(message)

        woken = longpoll.wait_for_change("another-agent", 0, 60)
        longpoll._waiters.wake(["another-agent"])
        bundle = asyncio.create_task(BundleEdge(django_app)(scope, receive, send))
        await asyncio.sleep(0.1)
        waited = not messages
        longpoll.answered(woken)  # the woken poll read its answer
        await asyncio.wait_for(bundle, 5)
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
        return waited, messages[0]["status"]

    assert async_to_sync(scenario)() == (True, 200)
    assert django_app.calls == 1  # the second answer was the edge's


@pytest.mark.parametrize("case", ["plain", "match", "weak", "list", "star", "other etag",
                                  "malformed etag", "accept json", "accept any", "https"])
@override_settings(SECURE_HSTS_SECONDS=3600)
def test_the_edges_answer_is_djangos_answer_to_the_same_request(agent, first, django_app,
                                                                case):
    """Each request answered by Django first, then by the edge for another agent of the
    environment: the same status, headers (in order) and body."""
    etag = f'"{first.checksum}+gzip"'
    extra = {"plain": [], "match": [("If-None-Match", etag)],
             "weak": [("If-None-Match", f"W/{etag}")],
             "list": [("If-None-Match", f'"x", {etag}')], "star": [("If-None-Match", "*")],
             "other etag": [("If-None-Match", f'"{first.checksum}"')],
             "malformed etag": [("If-None-Match", etag[1:])],
             "accept json": [("Accept", "application/json")],
             "accept any": [("Accept", "*/*")], "https": []}[case]
    scheme = "https" if case == "https" else "http"
    other = polled(agent_of_same_environment(agent))
    from_django = sent(django_app, headers=[*agent.headers, *extra], scheme=scheme)

    from_edge = sent(django_app, headers=[*other.headers, *extra], scheme=scheme)
    # The same request again through Django alone, with the other agent's token.
    again = sent(DjangoByClient(), headers=[*other.headers, *extra], scheme=scheme)

    assert django_app.calls == 1
    assert from_edge == per_request_removed(from_django) == per_request_removed(again)
    assert from_edge[0] == (304 if case in ("match", "weak", "list", "star") else 200)
    assert (b"strict-transport-security" in named(from_edge[1])) == (case == "https")


def agent_of_same_environment(agent):
    return enrolled_agent(agent.agent.environment, "web-2")


def test_a_304_is_djangos_until_django_gave_one(agent, first, django_app):
    etag = f'"{first.checksum}+gzip"'
    sent(django_app, headers=agent.headers)

    first_304 = sent(django_app, headers=[*agent.headers, ("If-None-Match", etag)])
    replayed = sent(django_app, headers=[*agent.headers, ("If-None-Match", etag)])

    assert django_app.calls == 2
    assert per_request_removed(first_304) == replayed and first_304[0] == 304
    assert first_304[2] == b""


def test_a_new_agent_of_the_environment_costs_no_query(
        agent, django_app, django_assert_num_queries):
    """Its environment is in its cached poll state: an agent asking a process it
    never asked before (a new connection, another worker) costs no query."""
    sent(django_app, headers=agent.headers)
    other = polled(agent_of_same_environment(agent))

    with django_assert_num_queries(0):
        sent(django_app, headers=other.headers)

    assert django_app.calls == 1


def published_and_polled(agents, environment, superuser, capture, *, workers):
    """A new snapshot, active, its agents' poll states written anew (on commit, as
    a publish does)."""
    with capture(execute=True):
        snapshot = publish_variant(environment, superuser, workers=workers)
    for agent in agents:
        polled(agent)
    return snapshot


def test_a_snapshot_the_agent_does_not_desire_is_djangos_every_time(
        agent, first, environment, superuser, django_app,
        django_capture_on_commit_callbacks):
    """The view serves every ready snapshot of the agent's environment; the edge only
    the one the agent's cached poll state desires."""
    _learned(agent, django_app)
    published_and_polled([agent], environment, superuser,
                         django_capture_on_commit_callbacks, workers=8)
    answers = [sent(django_app, headers=agent.headers, number=first.number)
               for _ in range(2)]

    assert django_app.calls == 3
    assert [a[0] for a in answers] == [200, 200]
    assert json.loads(gzip.decompress(answers[1][2]))["number"] == first.number


def test_a_removed_snapshot_is_never_served_again(agent, first, environment, superuser,
                                                  django_app, enroll,
                                                  django_capture_on_commit_callbacks):
    """Served by the edge while desired; once the environment moved on and an owner
    removed it, the bundle is Django's 404 — to the agent that fetched it and to one
    that never did."""
    _learned(agent, django_app)
    for workers in (8, 9):  # #1 no longer the rollback target
        published_and_polled([agent], environment, superuser,
                             django_capture_on_commit_callbacks, workers=workers)
    newcomer = polled(enroll("web-new"))
    with django_capture_on_commit_callbacks(execute=True):
        retention.snapshot_remove(snapshot=first, actor=superuser, reason="leaked a hostname")

    answers = [sent(django_app, headers=a.headers, number=first.number)
               for a in (agent, newcomer)]

    assert [(a[0], error_code(a)) for a in answers] == [(404, "not_found")] * 2


def test_a_rollback_to_the_same_content_is_served_under_its_own_number(
        agent, first, environment, superuser, django_app,
        django_capture_on_commit_callbacks):
    """A rollback renders an older snapshot's content as a new number: the same
    checksum, another bundle (its number and label)."""
    _learned(agent, django_app)
    published_and_polled([agent], environment, superuser,
                         django_capture_on_commit_callbacks, workers=8)
    with django_capture_on_commit_callbacks(execute=True):
        third = rollback_publication(first, superuser).snapshot
    polled(agent)
    assert third.checksum == first.checksum

    answers = [sent(django_app, headers=agent.headers, number=third.number)
               for _ in range(2)]

    assert [json.loads(gzip.decompress(a[2]))["number"] for a in answers] == [third.number] * 2


def test_a_new_snapshots_first_request_is_djangos_and_the_next_replay_it(
        agent, first, environment, superuser, django_app, django_assert_num_queries,
        django_capture_on_commit_callbacks):
    """The bundle answer is the view's alone: the edge replays what Django sent."""
    _learned(agent, django_app)
    second = published_and_polled([agent], environment, superuser,
                                  django_capture_on_commit_callbacks, workers=8)

    from_django = sent(django_app, headers=agent.headers, number=second.number)
    with django_assert_num_queries(0):
        replayed = sent(django_app, headers=agent.headers, number=second.number)
    etag = named(from_django[1])[b"etag"].decode()
    not_modified = sent(django_app, headers=[*agent.headers, ("If-None-Match", etag)],
                        number=second.number)

    assert django_app.calls == 3  # #1's first, #2's first, #2's first 304
    assert per_request_removed(from_django) == replayed and replayed[0] == 200
    assert etag == f'"{second.checksum}+gzip"' and not_modified[0] == 304


# --- what the edge must leave to Django ---------------------------------------------------


def _learned(agent, django_app):
    """The edge holds Django's answer for the agent's environment's snapshot #1."""
    assert sent(django_app, headers=agent.headers)[0] == 200
    assert sent(django_app, headers=agent.headers)[0] == 200
    assert django_app.calls == 1


def test_another_tenants_agent_never_gets_the_bundle_of_the_same_number(
        agent, enroll, blog, django_app):
    _learned(agent, django_app)
    outsider = polled(enroll("blog-1", env=blog))

    answer = sent(django_app, headers=outsider.headers)
    again = sent(django_app, headers=outsider.headers)

    assert (answer[0], error_code(answer), again[0]) == (404, "not_found", 404)
    assert django_app.calls == 3  # 404s are never kept


@pytest.mark.parametrize("number", [2, 99, 2**31 - 1])
def test_a_snapshot_the_environment_does_not_have_ready_is_djangos_404(
        agent, environment, superuser, django_app, number):
    publication = snapshot_publish(environment=environment, actor=superuser)
    publication_abandon(publication_id=str(publication.pk), reason="test")  # #2 invalid
    _learned(agent, django_app)

    answers = [sent(django_app, headers=agent.headers, number=number) for _ in range(2)]

    assert [(a[0], error_code(a)) for a in answers] == [(404, "not_found")] * 2
    assert django_app.calls == 3


def test_a_revoked_token_is_refused_by_django_from_its_next_request(
        agent, superuser, django_app, django_capture_on_commit_callbacks):
    _learned(agent, django_app)
    with django_capture_on_commit_callbacks(execute=True):
        enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)

    answer = sent(django_app, headers=agent.headers)

    assert (answer[0], error_code(answer)) == (401, "authentication_failed")


def test_a_decommissioned_agent_is_refused_by_django(agent, superuser, django_app,
                                                     django_capture_on_commit_callbacks):
    _learned(agent, django_app)
    with django_capture_on_commit_callbacks(execute=True):
        releases.agent_decommission(agent=agent.agent, actor=superuser,
                                    expected_generation=agent.fresh().generation)

    assert sent(django_app, headers=agent.headers)[0] == 401


def test_an_indebted_token_goes_to_django_whatever_the_cache_holds(agent, django_app,
                                                                   monkeypatch):
    _learned(agent, django_app)
    key = agent.token.removeprefix("bwa_").split(".")[0]
    monkeypatch.setattr(polldebt._debts, "_keys", frozenset({key}))

    assert sent(django_app, headers=agent.headers)[0] == 200
    assert django_app.calls == 2


def test_a_token_with_no_poll_state_goes_to_django(agent, django_app):
    _learned(agent, django_app)
    forget_poll_states([agent.token.removeprefix("bwa_").split(".")[0]])

    assert sent(django_app, headers=agent.headers)[0] == 200
    assert django_app.calls == 2


@pytest.mark.parametrize(("case", "status"), [
    ("no Authorization", 401), ("Basic", 401), ("a user token", 401), ("a wrong secret", 401),
    ("an unknown key", 401), ("Authorization twice", 200), ("a host not allowed", 400),
])
def test_a_token_the_cache_does_not_vouch_for_is_djangos(agent, django_app, case, status):
    _learned(agent, django_app)
    auth = f"Bearer {agent.token}"
    key = agent.token.split(".")[0]
    headers = dict(agent.headers)
    extra = []
    if case == "no Authorization":
        del headers["Authorization"]
    elif case == "Basic":
        headers["Authorization"] = "Basic " + agent.token
    elif case == "a user token":
        headers["Authorization"] = auth.replace("bwa_", "bwu_")
    elif case == "a wrong secret":
        headers["Authorization"] = f"Bearer {key}.{'x' * 43}"
    elif case == "an unknown key":
        headers["Authorization"] = auth.replace(key, "bwa_000000000000")
    elif case == "Authorization twice":
        extra = [("Authorization", auth)]
    elif case == "a host not allowed":
        headers["Host"] = "evil.example"

    answer = sent(django_app, headers=[*headers.items(), *extra])

    assert django_app.calls == 2
    assert answer[0] == status  # the client shim joins a repeated header: Django's 200


@pytest.mark.parametrize(("path", "status"), [
    (bundle_url(1) + "/", 404), ("/api/v1/agent/snapshots/1a/bundle", 404),
    ("/api/v1/agent/snapshots/-1/bundle", 404), ("/api/v1/agent/snapshots/0/bundle", 404),
    ("/api/v1/agent/snapshots/\u0661/bundle", 404), (bundle_url(2**31), 404),
    (bundle_url(10**30), 404), ("/api/v1/agent/snapshots/" + "9" * 5000 + "/bundle", 404),
    ("/api/v1/agent/snapshots//bundle", 404),
])
def test_a_path_the_edge_does_not_read_is_djangos(agent, django_app, path, status):
    _learned(agent, django_app)

    answer = sent(django_app, headers=agent.headers, path=path)

    assert (answer[0], django_app.calls) == (status, 2)


@pytest.mark.parametrize(("method", "query", "status"), [
    ("HEAD", b"", 200), ("POST", b"", 405), ("GET", b"x=1", 200), ("GET", b"format=xml", 404),
])
def test_another_method_or_a_query_string_is_djangos(agent, django_app, method, query, status):
    _learned(agent, django_app)

    answer = sent(django_app, headers=agent.headers, method=method, query=query)

    assert (answer[0], django_app.calls) == (status, 2)


@pytest.mark.parametrize("accept", [None, "", "identity", "br", "gzip;q=0", "*;q=0"])
def test_a_client_not_accepting_gzip_gets_djangos_identity_bytes(agent, first, django_app,
                                                                 accept):
    _learned(agent, django_app)
    headers = [h for h in agent.headers if h[0] != "Accept-Encoding"]
    if accept is not None:
        headers.append(("Accept-Encoding", accept))

    status, answer_headers, body = sent(django_app, headers=headers)

    assert (status, body, django_app.calls) == (200, bytes(first.bundle), 2)
    assert b"content-encoding" not in named(answer_headers)


@pytest.mark.parametrize(("header", "status"), [
    (("Accept", "image/png"), 406), (("Accept", "text/html"), 200),
    (("Accept-Encoding", "gzip"), 200), (("If-Match", '"other"'), 412),
    (("If-Unmodified-Since", "Thu, 01 Jan 1970 00:00:00 GMT"), 200),
])
def test_a_header_django_may_answer_otherwise_is_djangos(agent, django_app, header, status):
    """Accept other than JSON (DRF may refuse it), Accept-Encoding twice, preconditions."""
    _learned(agent, django_app)

    answer = sent(django_app, headers=[*agent.headers, header])

    assert (answer[0], django_app.calls) == (status, 2)


def test_an_address_refused_for_failed_authentications_goes_to_django(agent, django_app):
    _learned(agent, django_app)
    throttling.blocked_addresses.block("10.0.0.7", time.time() + 60)
    try:
        refused = sent(django_app, headers=agent.headers)
        other = sent(django_app, headers=agent.headers, client=("10.0.0.8", 1))
    finally:
        throttling.blocked_addresses._until.clear()

    assert (refused[0], other[0], django_app.calls) == (200, 200, 2)


@override_settings(SECURE_SSL_REDIRECT=True)
def test_plain_http_goes_to_django_for_its_redirect_when_https_is_required(agent, django_app):
    answer = sent(django_app, headers=agent.headers)
    again = sent(django_app, headers=agent.headers)

    assert (answer[0], again[0], django_app.calls) == (301, 301, 2)


def test_a_poll_state_not_naming_the_environment_leaves_the_bundle_to_django(
        agent, django_app):
    """A state cached before it named the agent's environment (an older release
    during an upgrade): Django answers until the poll state is written again."""
    sent(django_app, headers=agent.headers)
    key = agent.agent.token_key
    older = {k: v for k, v in fleet_cache.poll_state(key).items() if k != "environment_id"}
    fleet_cache._cache().set(f"fleet:poll:{key}", older, timeout=60)

    assert sent(django_app, headers=agent.headers)[0] == 200
    assert django_app.calls == 2


@pytest.mark.parametrize("counted_in", ["redis", "process"])
def test_the_agents_api_rate_counts_the_edges_answers_too(agent, django_app, settings,
                                                          monkeypatch, counted_in):
    """Counted in Redis as Django counts it, or, without Redis (embedded mode), by
    DRF's throttle itself in this process's cache."""
    if counted_in == "process":
        monkeypatch.setattr(bundle_edge.cache, "async_redis", lambda: None)
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "agent": "3/minute"}

    answers = [sent(django_app, headers=agent.headers) for _ in range(4)]

    assert [a[0] for a in answers] == [200, 200, 200, 429]
    assert django_app.calls == 2  # the first, and the refusal
    assert error_code(answers[3]) == "throttled"


def test_with_the_agents_api_rate_off_the_edge_reads_no_count(settings, monkeypatch):
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "agent": None}
    monkeypatch.setattr(bundle_edge.cache, "async_redis",
                        lambda: pytest.fail("the count was read"))

    assert async_to_sync(bundle_edge.within_rate)(1) is True


# --- what is kept ----------------------------------------------------------------------


def test_kept_answers_are_bounded_by_their_bytes_least_recently_used_first():
    one = bundle_edge.ANSWER_OVERHEAD + 100
    kept = bundle_edge._Answers(max_bytes=2 * one + 50)
    for number in (1, 2):
        kept.keep((1, number, False), Answer(200, [], b"x" * 100))
    kept.get((1, 1, False))  # used: #2 is now the least recently used

    kept.keep((1, 3, False), Answer(200, [], b"x" * 100))
    kept.keep((1, 4, False), Answer(200, [], b"x" * (2 * one + 51)))  # larger than the bound

    assert [bool(kept.get((1, n, False))) for n in (1, 2, 3, 4)] == [True, False, True, False]
    assert kept._bytes == 2 * one


def test_headers_and_many_small_answers_count_against_the_bound():
    kept = bundle_edge._Answers(max_bytes=100_000)
    headers = [(b"x-header", b"v" * 1000)] * 10  # about 10 KB of headers, a 1-byte body
    for number in range(1, 1000):
        kept.keep((1, number, False), Answer(200, headers, b"x"))
    assert kept._bytes <= 100_000
    assert len(kept._kept) == 100_000 // Answer(200, headers, b"x").size


def test_an_answer_setting_a_cookie_is_not_kept(agent, django_app):
    async def cookie_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"set-cookie", b"a=b")]})
        await send({"type": "http.response.body", "body": b"{}"})

    sent(cookie_app, headers=agent.headers)

    assert bundle_edge._answers._kept == {}


@pytest.mark.parametrize(("path", "number"), [
    ("/api/v1/agent/snapshots/1/bundle", 1), ("/api/v1/agent/snapshots/007/bundle", 7),
    (f"/api/v1/agent/snapshots/{2**31 - 1}/bundle", 2**31 - 1),
    (f"/api/v1/agent/snapshots/{2**31}/bundle", None),
    ("/api/v1/agent/snapshots/0/bundle", None), ("/api/v1/agent/snapshots/1/bundle\n", None),
    ("/api/v1/agent/snapshots/1/bundle/", None), ("/api/v1/agent/snapshots/\u0661/bundle", None),
    ("/api/v1/agent/snapshots/" + "1" * 11 + "/bundle", None),
])
def test_the_number_read_from_the_path(path, number):
    scope = {"method": "GET", "path": path, "query_string": b""}

    assert bundle_edge.requested_number(scope) == number


def test_an_answer_sent_in_several_parts_is_kept_whole(agent, django_app):
    async def chunked_app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"etag", b'"x"')]})
        await send({"type": "http.response.body", "body": b"ab", "more_body": True})
        await send({"type": "http.response.body", "body": b"cd"})

    first = sent(chunked_app, headers=agent.headers)
    again = sent(django_app, headers=agent.headers)

    assert first == again == (200, [(b"etag", b'"x"')], b"abcd")
    assert django_app.calls == 0


def test_a_replay_never_carries_the_request_id_another_client_chose(agent, django_app):
    first = sent(django_app, headers=[*agent.headers, ("X-Request-ID", "attacker-1")])
    assert named(first[1])[b"x-request-id"] == b"attacker-1"  # Django's own answer

    other = polled(agent_of_same_environment(agent))
    replayed = sent(django_app, headers=other.headers)

    assert django_app.calls == 1
    assert b"x-request-id" not in named(replayed[1])


def test_requests_arriving_while_django_answers_the_first_wait_for_its_answer(
        agent, first, django_app):
    """After a publish every agent asks for the same new bundle at once: Django answers
    the first, the others get its answer replayed (not a Django request each)."""
    others = [polled(enrolled_agent(agent.agent.environment, f"web-{i}")) for i in (2, 3, 4)]

    async def all_at_once():
        async def one(headers):
            sent_messages = []

            async def receive():
                return {"type": "http.request", "body": b"", "more_body": False}

            async def send(message):
                sent_messages.append(message)

            scope = {"type": "http", "method": "GET", "path": bundle_url(1),
                     "query_string": b"", "scheme": "http", "client": ("10.0.0.7", 50000),
                     "headers": [(n.lower().encode(), v.encode()) for n, v in headers]}
            await BundleEdge(django_app)(scope, receive, send)
            return sent_messages[0]["status"], b"".join(
                m.get("body", b"") for m in sent_messages[1:])
        return await asyncio.gather(*(one(a.headers) for a in [agent, *others]))

    answers = async_to_sync(all_at_once)()

    assert django_app.calls == 1
    assert {status for status, _ in answers} == {200}
    assert len({body for _, body in answers}) == 1


def test_a_first_answer_left_on_a_loop_gone_fails_no_request_of_the_next(
        agent, first, django_app):
    gone = asyncio.new_event_loop()
    left = gone.create_future()
    left.add_done_callback(lambda _: None)  # a request of that loop waited for it
    gone.close()
    bundle_edge._answering[(agent.agent.environment_id, 1, False)] = left
    try:
        answer = sent(django_app, headers=agent.headers)
    finally:
        bundle_edge._answering.clear()

    assert answer[0] == 200 and django_app.calls == 1
    assert not left.done()  # never resolved from another loop
