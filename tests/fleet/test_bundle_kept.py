"""The bundle route (agentapi/bundle.py) through the served HTTP stack: a snapshot's
gzip bytes kept by content and answered with no SQL to the agents whose vouched poll
state desires it; every other request answered from the database after the route's
checks. An answer from the database carries a request id; one from the kept bytes
does not (`source`).

The stack runs under async_to_sync, its thread hops on the test's thread (in its
transaction), so django_assert_num_queries counts the route's queries."""

import asyncio
import gzip
import json
import time

import pytest
from asgiref.sync import async_to_sync
from django.test.utils import override_settings

from agentapi import bundle
from apps.core import throttling
from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, polldebt
from apps.releases import retention
from apps.releases import services as releases
from apps.releases.publishing import publication_abandon
from apps.releases.services import snapshot_publish
from apps.snapshots.models import Snapshot
from tests.agentroutes import (
    HANDED_ON,
    asgi_answer,
    scope_of,
    stack_answer,
    thread_hops_on_the_tests_thread,
)
from tests.factories import enrolled_agent, poll, publish_variant, rollback_publication
from tests.fleet.support import bundle_url, unvouched_authorization

KEPT, DATABASE = "kept", "database"


def fetched(headers, *, number=1, path=None, method="GET", query="", secure=False,
            address="10.0.0.7"):
    """(status, headers, body) of the stack's answer to a bundle request."""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path or bundle_url(number),
               "QUERY_STRING": query, "wsgi.url_scheme": "https" if secure else "http",
               "REMOTE_ADDR": address,
               **{"HTTP_" + n.upper().replace("-", "_"): v for n, v in headers}}
    scope = scope_of(environ)
    scope["headers"] = [(n.lower().encode(), v.encode()) for n, v in headers]
    return stack_answer(scope)


def source(answer) -> str:
    return DATABASE if "x-request-id" in answer[1] else KEPT


def error_code(answer) -> str:
    assert answer[1]["content-type"] == "application/json", answer[1]
    return json.loads(answer[2])["error"]["code"]


def polled(agent):
    """The agent after its first polls: its poll state cached and the poll debts
    read, as on a web node; `agent.headers` an agent's bundle request's."""
    etag = poll(agent.client)["ETag"]
    assert poll(agent.client, etag).status_code == 304
    agent.headers = [("Host", "testserver"), ("Authorization", f"Bearer {agent.token}"),
                     ("Accept-Encoding", "gzip")]
    return agent


@pytest.fixture
def agent(enroll, first):
    return polled(enroll())


def test_a_desired_bundle_is_read_once_then_answered_with_no_sql(
        agent, first, django_assert_num_queries):
    with django_assert_num_queries(1):  # the snapshot's gzip bytes; no token query
        first_answer = fetched(agent.headers)
    with django_assert_num_queries(0):
        again = fetched(agent.headers)

    assert (source(first_answer), source(again)) == (KEPT, KEPT)
    assert first_answer == again
    status, headers, body = again
    assert (status, headers["content-encoding"]) == (200, "gzip")
    assert body == bytes(Snapshot.objects.get(pk=first.pk).bundle_gzip)
    assert gzip.decompress(body) == bytes(first.bundle)


@pytest.mark.parametrize("case", ["plain", "match", "weak", "list", "star", "other etag",
                                  "malformed etag", "https"])
def test_the_kept_answer_is_the_databases_answer_to_the_same_request(agent, first, case):
    """The same request answered from the kept bytes and, its poll state forgotten,
    from the database: the same status, headers and body (but the request id)."""
    etag = f'"{first.checksum}+gzip"'
    extra = {"plain": [], "match": [("If-None-Match", etag)],
             "weak": [("If-None-Match", f"W/{etag}")],
             "list": [("If-None-Match", f'"x", {etag}')], "star": [("If-None-Match", "*")],
             "other etag": [("If-None-Match", f'"{first.checksum}"')],
             "malformed etag": [("If-None-Match", etag[1:])], "https": []}[case]
    kept = fetched([*agent.headers, *extra], secure=case == "https")
    fleet_cache.forget_poll_states([agent.agent.token_key])
    database = fetched([*agent.headers, *extra], secure=case == "https")

    assert (source(kept), source(database)) == (KEPT, DATABASE)
    assert kept == (database[0], {n: v for n, v in database[1].items() if n != "x-request-id"},
                    database[2])
    assert kept[0] == (304 if case in ("match", "weak", "list", "star") else 200)
    assert kept[1]["etag"] == etag and kept[1]["vary"] == "Accept-Encoding"
    assert kept[1]["cache-control"] == "private, max-age=31536000, immutable"


def test_another_agent_of_the_environment_costs_no_query(agent, django_assert_num_queries):
    fetched(agent.headers)
    other = polled(enrolled_agent(agent.agent.environment, "web-2"))

    with django_assert_num_queries(0):
        assert source(fetched(other.headers)) == KEPT


def test_requests_arriving_during_the_first_read_find_its_bytes_kept(
        agent, django_assert_num_queries):
    """After a publish every agent asks for the same new bundle at once: one read."""
    others = [polled(enrolled_agent(agent.agent.environment, f"web-{i}")) for i in (2, 3, 4)]
    scopes = []
    for each in (agent, *others):
        scope = scope_of({"REQUEST_METHOD": "GET", "PATH_INFO": bundle_url(1)})
        scope["headers"] = [(n.lower().encode(), v.encode()) for n, v in each.headers]
        scopes.append(scope)

    async def all_at_once():
        return await asyncio.gather(*(asgi_answer(bundle.answer_bundle, scope)
                                      for scope in scopes))

    with django_assert_num_queries(1), thread_hops_on_the_tests_thread():
        answers = async_to_sync(all_at_once)()

    assert {start["status"] for start, _ in answers} == {200}
    assert len({body for _, body in answers}) == 1


def published_and_polled(agents, environment, superuser, capture, *, workers):
    """A new snapshot, active, its agents' poll states written anew (on commit, as
    a publish does)."""
    with capture(execute=True):
        snapshot = publish_variant(environment, superuser, workers=workers)
    for each in agents:
        polled(each)
    return snapshot


def test_a_snapshot_the_agent_does_not_desire_is_read_from_the_database_every_time(
        agent, first, environment, superuser, django_capture_on_commit_callbacks):
    fetched(agent.headers)
    published_and_polled([agent], environment, superuser,
                         django_capture_on_commit_callbacks, workers=8)
    answers = [fetched(agent.headers, number=first.number) for _ in range(2)]

    assert [(a[0], source(a)) for a in answers] == [(200, DATABASE)] * 2
    assert json.loads(gzip.decompress(answers[1][2]))["number"] == first.number


def test_a_removed_snapshot_is_never_served_again(agent, first, environment, superuser,
                                                  enroll,
                                                  django_capture_on_commit_callbacks):
    """Kept while desired; once the environment moved on and an owner removed it,
    404 — gzip or not, to the agent that fetched it and to one that never did."""
    fetched(agent.headers)
    for workers in (8, 9):  # #1 no longer the rollback target
        published_and_polled([agent], environment, superuser,
                             django_capture_on_commit_callbacks, workers=workers)
    newcomer = polled(enroll("web-new"))
    with django_capture_on_commit_callbacks(execute=True):
        retention.snapshot_remove(snapshot=first, actor=superuser, reason="leaked a hostname")

    answers = [fetched(headers, number=first.number) for headers in (
        agent.headers, newcomer.headers, agent.headers[:2])]

    assert [(a[0], error_code(a)) for a in answers] == [(404, "not_found")] * 3


def test_a_rollback_to_the_same_content_is_served_under_its_own_number(
        agent, first, environment, superuser, django_capture_on_commit_callbacks):
    """A rollback renders an older snapshot's content as a new number: the same
    checksum, another bundle (its number and label)."""
    fetched(agent.headers)
    published_and_polled([agent], environment, superuser,
                         django_capture_on_commit_callbacks, workers=8)
    with django_capture_on_commit_callbacks(execute=True):
        third = rollback_publication(first, superuser).snapshot
    polled(agent)
    assert third.checksum == first.checksum

    answers = [fetched(agent.headers, number=third.number) for _ in range(2)]

    assert [json.loads(gzip.decompress(a[2]))["number"] for a in answers] == [third.number] * 2
    assert [source(a) for a in answers] == [KEPT, KEPT]


def test_another_tenants_agent_never_gets_the_bundle_of_the_same_number(agent, enroll, blog):
    fetched(agent.headers)
    outsider = polled(enroll("blog-1", env=blog))

    answer = fetched(outsider.headers)

    assert (answer[0], error_code(answer)) == (404, "not_found")


@pytest.mark.parametrize("number", [2, 99, 2**31 - 1, 2**31, 10**30])
def test_a_snapshot_the_environment_does_not_have_ready_is_404(
        agent, environment, superuser, number):
    publication = snapshot_publish(environment=environment, actor=superuser)
    publication_abandon(publication_id=str(publication.pk), reason="test")  # #2 invalid

    answer = fetched(agent.headers, number=number)

    assert (answer[0], error_code(answer)) == (404, "not_found")
    assert json.loads(answer[2])["error"]["message"] == "No snapshot {} for this agent.".format(
        number if number < 10**10 else "of that number")


def test_a_revoked_token_is_refused_from_its_next_request(
        agent, superuser, django_capture_on_commit_callbacks):
    fetched(agent.headers)
    with django_capture_on_commit_callbacks(execute=True):
        enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)

    answer = fetched(agent.headers)

    assert (answer[0], error_code(answer)) == (401, "authentication_failed")
    assert answer[1]["www-authenticate"] == "Bearer"


def test_a_decommissioned_agent_is_refused(agent, superuser,
                                           django_capture_on_commit_callbacks):
    fetched(agent.headers)
    with django_capture_on_commit_callbacks(execute=True):
        releases.agent_decommission(agent=agent.agent, actor=superuser,
                                    expected_generation=agent.fresh().generation)

    assert fetched(agent.headers)[0] == 401


def test_an_indebted_token_is_answered_from_the_database(agent, monkeypatch):
    fetched(agent.headers)
    monkeypatch.setattr(polldebt._debts, "_keys", frozenset({agent.agent.token_key}))

    answer = fetched(agent.headers)

    assert (answer[0], source(answer)) == (200, DATABASE)


@pytest.mark.parametrize(("case", "status"), [
    ("no Authorization", 401), ("Basic", 401), ("a user token", 401), ("a wrong secret", 401),
    ("an unknown key", 401), ("Authorization twice", 401), ("a host not allowed", 400),
])
def test_a_token_the_cache_does_not_vouch_for_is_checked_in_the_database(agent, case, status):
    fetched(agent.headers)
    headers = dict(agent.headers)
    extra = []
    if case == "Authorization twice":
        extra = [("Authorization", headers["Authorization"])]
    elif case == "a host not allowed":
        headers["Host"] = "evil.example"
    else:
        headers["Authorization"] = unvouched_authorization(agent.token, case)
        headers = {name: value for name, value in headers.items() if value is not None}

    answer = fetched([*headers.items(), *extra])

    assert (answer[0], source(answer)) == (status, DATABASE)
    if status == 400:
        assert json.loads(answer[2])["error"]["details"] == [
            {"field": "Host", "message": "not allowed here"}]


@pytest.mark.parametrize(("path", "status"), [
    (bundle_url(1) + "/", 404), ("/api/v1/agent/snapshots/1a/bundle", 404),
    ("/api/v1/agent/snapshots/-1/bundle", 404), ("/api/v1/agent/snapshots/\u0661/bundle", 404),
    ("/api/v1/agent/snapshots//bundle", 404),
])
def test_a_path_not_of_a_number_is_not_the_routes(agent, path, status):
    assert fetched(agent.headers, path=path)[0] == HANDED_ON


@pytest.mark.parametrize(("digits", "status"), [
    ("0", 404), ("9" * 11, 404), ("9" * 5000, 404), ("0001", 200), ("0" * 5000 + "1", 200),
])
def test_the_number_is_read_from_any_run_of_digits(agent, digits, status):
    answer = fetched(agent.headers, path=f"/api/v1/agent/snapshots/{digits}/bundle")

    assert answer[0] == status


@pytest.mark.parametrize(("method", "query", "status"), [
    ("HEAD", "", 200), ("POST", "", 405), ("DELETE", "", 405), ("GET", "x=1", 200),
])
def test_another_method_or_a_query_string_is_answered_from_the_database(agent, method, query,
                                                                        status):
    fetched(agent.headers)

    answer = fetched(agent.headers, method=method, query=query)

    assert (answer[0], source(answer)) == (status, DATABASE)
    if status == 405:
        assert (answer[1]["allow"], error_code(answer)) == ("GET, HEAD", "method_not_allowed")
    if method == "HEAD":
        assert answer[2] == b"" and answer[1]["content-encoding"] == "gzip"


@pytest.mark.parametrize("accept", [None, "", "identity", "br", "gzip;q=0", "*;q=0"])
def test_a_client_not_accepting_gzip_gets_the_identity_bytes(agent, first, accept):
    headers = [h for h in agent.headers if h[0] != "Accept-Encoding"]
    if accept is not None:
        headers.append(("Accept-Encoding", accept))

    status, answer_headers, body = fetched(headers)

    assert (status, body) == (200, bytes(first.bundle))
    assert "content-encoding" not in answer_headers
    assert answer_headers["etag"] == f'"{first.checksum}"'


@pytest.mark.parametrize(("header", "status"), [
    (("Accept", "image/png"), 200), (("Accept", "text/html"), 200),
    (("Accept-Encoding", "gzip"), 200), (("If-Match", '"other"'), 412),
    (("If-Unmodified-Since", "Thu, 01 Jan 1970 00:00:00 GMT"), 200),
])
def test_a_repeated_header_or_a_precondition_is_answered_from_the_database(agent, header,
                                                                          status):
    """The bundle is JSON whatever Accept says; Accept-Encoding twice and
    preconditions but If-None-Match are the database's (Django's conditional rules)."""
    fetched(agent.headers)

    answer = fetched([*agent.headers, header])

    assert answer[0] == status
    assert source(answer) == (KEPT if header[0] == "Accept" else DATABASE)


def test_an_address_refused_for_failed_authentications_is_refused(agent, settings):
    fetched(agent.headers)
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "failed_auth": "60/minute"}  # (what blocks it)
    throttling.blocked_addresses.block("10.0.0.7", time.time() + 60)

    refused = fetched(agent.headers)
    other = fetched(agent.headers, address="10.0.0.8")

    assert (refused[0], error_code(refused), other[0]) == (429, "throttled", 200)


@override_settings(SECURE_SSL_REDIRECT=True)
def test_plain_http_is_redirected_when_https_is_required(agent):
    answers = [fetched(agent.headers) for _ in range(2)]

    assert [a[0] for a in answers] == [301, 301]
    assert answers[0][1]["location"] == "https://testserver" + bundle_url(1)
    assert fetched(agent.headers, secure=True)[0] == 200


def test_a_poll_state_not_naming_the_environment_leaves_the_bundle_to_the_database(agent):
    """A state cached before it named the agent's environment (an older release
    during an upgrade): answered from the database until written again."""
    key = agent.agent.token_key
    older = {k: v for k, v in fleet_cache.poll_state(key).items() if k != "environment_id"}
    fleet_cache._cache().set(f"fleet:poll:{key}", older, timeout=60)

    assert source(fetched(agent.headers)) == DATABASE


@pytest.mark.parametrize("counted_in", ["redis", "process"])
def test_the_agents_api_rate_counts_kept_answers_too(agent, settings, monkeypatch, counted_in):
    """Counted in Redis as DRF counts it, or, without Redis (embedded mode), by DRF's
    throttle itself in this process's cache."""
    if counted_in == "process":
        monkeypatch.setattr(fleet_cache, "async_redis", lambda: None)
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "agent": "3/minute"}

    answers = [fetched(agent.headers) for _ in range(4)]

    assert [(a[0], source(a)) for a in answers] == [(200, KEPT)] * 3 + [(429, DATABASE)]
    assert error_code(answers[3]) == "throttled"


def test_kept_bytes_are_bounded_least_recently_used_first():
    kept = bundle._Kept(max_bytes=250)
    for number in (1, 2):
        kept.keep((1, number, "c"), b"x" * 100)
    kept.get((1, 1, "c"))  # used: #2 is now the least recently used

    kept.keep((1, 3, "c"), b"x" * 100)
    kept.keep((1, 4, "c"), b"x" * 251)  # larger than the bound: never kept

    assert [kept.get((1, n, "c")) is not None for n in (1, 2, 3, 4)] == [True, False, True,
                                                                          False]
    assert kept._bytes == 200
