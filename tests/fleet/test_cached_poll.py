"""The poll's route (agentapi/cached.py): its 304 and 200 answered from the cache on the
event loop, every other poll from the database (agentapi/desired.py), counted by why;
what the database's answers say (401 with the envelope, 200, 429, 400) is
tests/fleet/test_desired.py's."""

import asyncio
import threading
import time

import pytest
from django.core.cache import cache as django_cache
from django.core.cache.backends.redis import RedisCache
from django.db import DatabaseError
from django.test.utils import override_settings

from agentapi import cached, longpoll
from agentapi.cached import DESIRED_PATH
from apps.core import throttling
from apps.fleet import announcements, enrollment, polldebt
from apps.fleet import cache as fleet_cache
from apps.fleet import selectors as fleet_selectors
from tests.agentroutes import HANDED_ON, stack_answer
from tests.factories import poll
from tests.fleet.support import unvouched_authorization


def _key(warm) -> str:
    return warm.token.removeprefix("bwa_").split(".")[0]


DATABASE = "database"  # answered from the database (agentapi.desired: with a request id)


def stack_poll(*, headers=(), method="GET", path=DESIRED_PATH, query=b"", scheme="http",
               client=("10.0.0.7", 50000), kind="http"):
    """(status, headers) of the HTTP stack's answer, the status DATABASE when the poll
    was answered from the database (HANDED_ON: handed on to Django)."""
    scope = {"type": kind, "method": method, "path": path, "query_string": query,
             "scheme": scheme, "client": client,
             "headers": [(n.lower().encode(), v.encode()) for n, v in headers]}
    status, answered, _ = stack_answer(scope)
    return DATABASE if "x-request-id" in answered else status, answered


@pytest.fixture
def warm(enroll, first, monkeypatch):
    """An agent whose poll state is cached, with this process's poll debts read and
    its heartbeats flushed a moment ago: what a web node polled for a while looks like."""
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=lambda: 0.0))
    agent = enroll()
    response = poll(agent.client)
    assert response.status_code == 200
    assert poll(agent.client, response["ETag"]).status_code == 304  # the debts read
    fleet_cache._heartbeats._pending.clear()
    fleet_cache._heartbeats._flushed_at = time.time()
    agent.etag = response["ETag"]
    agent.headers = [("Host", "testserver"), ("Authorization", f"Bearer {agent.token}")]
    return agent


@pytest.mark.parametrize("form", ["exact", "list", "star", "weak"])
@pytest.mark.parametrize("method", ["GET", "HEAD"])
def test_a_matching_poll_is_304_from_the_cache_with_no_sql_and_a_heartbeat(
        warm, form, method, django_assert_num_queries):
    header = {"exact": warm.etag, "list": f'"nope", {warm.etag}', "star": "*",
              "weak": f"W/{warm.etag}"}[form]
    fleet_cache._heartbeats._pending.clear()

    with django_assert_num_queries(0):
        status, headers = stack_poll(headers=[*warm.headers, ("If-None-Match", header)],
                                    method=method)

    assert (status, headers["etag"], headers["cache-control"]) == (304, warm.etag, "no-cache")
    assert warm.agent.pk in fleet_cache._heartbeats.pending()


@pytest.mark.parametrize(("case", "reason"), [
    ("no If-None-Match", "no_validator"), ("another ETag", 200),
    ("a malformed If-None-Match", 200), ("an unterminated tag", 200),
    ("a query string", "request"), ("POST", "request"), ("another path", None),
    ("If-Match", "request"), ("If-Unmodified-Since", "request"),
    ("Authorization twice", "request"), ("If-None-Match twice", "request"),
    ("no Authorization", "token"), ("Basic", "token"), ("a user token", "token"),
    ("a wrong secret", "secret"), ("an unknown key", "not_cached"),
    ("a NUL in the token", "token"), ("a host not allowed", "host"), ("no Host", "host"),
])
def test_what_the_cache_cannot_answer_goes_to_the_database_counted_by_why(
        warm, case, reason, to_django):
    auth = f"Bearer {warm.token}"
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
    elif case in ("no Authorization", "Basic", "a user token", "a wrong secret",
                  "an unknown key"):
        headers["Authorization"] = unvouched_authorization(warm.token, case)
        headers = {name: value for name, value in headers.items() if value is not None}
    elif case == "a NUL in the token":
        headers["Authorization"] = auth + "\x00"
    elif case == "a host not allowed":
        headers["Host"] = "evil.example"
    elif case == "no Host":
        del headers["Host"]

    status, _ = stack_poll(headers=[*headers.items(), *extra], method=method, path=path,
                          query=query)

    if reason == 200:  # the cache's 200, each time it is asked
        assert (status, to_django()) == (200, {})
        assert stack_poll(headers=[*headers.items(), *extra])[0] == 200
        assert to_django() == {}
        return
    assert status == (DATABASE if reason else HANDED_ON)
    assert to_django() == ({reason: 1} if reason else {})  # another path is not a poll


def test_a_revoked_token_goes_to_django_on_its_next_poll(warm, superuser, to_django,
                                                         django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        enrollment.agent_token_revoke(agent=warm.agent, actor=superuser)

    status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert (status, to_django()) == (DATABASE, {"not_cached": 1})


def test_an_indebted_token_goes_to_django_whatever_the_cache_holds(warm, monkeypatch,
                                                                   to_django):
    """A change's PollInvalidation not yet settled: the cached ETag may be stale
    (its drop may have failed), so the database answers."""
    key = warm.token.removeprefix("bwa_").split(".")[0]
    monkeypatch.setattr(polldebt._debts, "_keys", frozenset({key}))

    status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert (status, to_django()) == (DATABASE, {"stale": 1})


@pytest.mark.parametrize("indebted", [False, True])
def test_debts_due_are_read_by_the_poll_that_finds_them_due(warm, monkeypatch, indebted):
    reads = []

    def poll_debts():
        reads.append(1)
        return frozenset({_key(warm)} if indebted else set()), []

    monkeypatch.setattr(polldebt.selectors, "poll_debts", poll_debts)
    monkeypatch.setattr(polldebt._debts, "clock", lambda: 10.0)  # due

    status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])
    again, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert (status, again) == ((DATABASE, DATABASE) if indebted else (304, 304))
    assert reads == [1]  # once per refresh interval, not per poll


@pytest.mark.parametrize("read_before", [True, False])
def test_debts_the_database_cannot_read_keep_the_last_set_read(warm, monkeypatch, to_django,
                                                              read_before):
    """While the database fails the last debts read are trusted (polls stay 304 from
    the cache); a process that never read them answers from the database."""
    def failing():
        raise DatabaseError("down")

    monkeypatch.setattr(polldebt.selectors, "poll_debts", failing)
    if not read_before:
        monkeypatch.setattr(polldebt, "_debts", polldebt._Debts())
    monkeypatch.setattr(polldebt._debts, "clock", lambda: 10.0)

    status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert (status, to_django()) == ((304, {}) if read_before
                                     else (DATABASE, {"debt_unknown": 1}))


def test_a_heartbeat_flush_due_is_done_on_a_thread_and_the_poll_answered(warm):
    fleet_cache._heartbeats._flushed_at = 0.0
    fleet_cache._heartbeats._pending.clear()
    django_cache.delete_many([f"fleet:seen:{warm.agent.pk}"])

    status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert status == 304
    assert fleet_cache._heartbeats.pending() == {}  # flushed to the cache
    assert warm.agent.pk in fleet_cache.heartbeats([warm.agent.pk])


def _lifetime(key: str) -> float | None:
    """Seconds the cache keeps the token's poll state for; None without one."""
    backend = fleet_cache._cache()
    full = backend.make_key(fleet_cache._poll_key(key))
    if isinstance(backend, RedisCache):
        seconds = backend._cache.get_client(full).ttl(full)
        return None if seconds < 0 else seconds
    expires = backend._expire_info.get(full)
    return None if expires is None else expires - time.time()


@pytest.fixture(params=["configured", "local memory"])
def either_cache(request, warm):
    """The test's cache (Redis in CI), then local memory holding warm's answer."""
    if request.param == "configured":
        yield
        return
    with override_settings(CACHES={"default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": "either"}}):
        fleet_cache.store_poll_states(fleet_selectors.poll_states_of([_key(warm)]))
        yield


def test_a_cached_answer_lives_its_tokens_lifetime_from_its_write(warm, either_cache):
    """Polls never prolong it: a state written wrongly after its change's debt was
    settled (a write-back stalled past the sweep) expires, and the database writes
    it anew."""
    key, polled = _key(warm), [*warm.headers, ("If-None-Match", warm.etag)]
    lifetime = fleet_cache.poll_state_lifetime(key)
    assert lifetime - 5 < _lifetime(key) <= lifetime
    django_cache.touch(f"fleet:poll:{key}", 60)  # its lifetime nearly out
    fleet_cache._heartbeats._flushed_at = 0.0

    assert stack_poll(headers=polled)[0] == 304  # this poll flushes the heartbeats
    assert _lifetime(key) <= 60


def test_the_lifetimes_are_spread_over_the_tokens():
    """The agents of one refill (written at once) go back to the database over half
    an hour, not together."""
    lifetimes = [fleet_cache.poll_state_lifetime(f"{n:016x}") for n in range(2_000)]

    assert 1800 <= min(lifetimes) < 1830 and 3570 < max(lifetimes) < 3600
    assert len({seconds // 60 for seconds in lifetimes}) == 30  # every minute of the span


def test_an_address_refused_for_failed_authentications_goes_to_django(warm, to_django):
    throttling.blocked_addresses.block("10.0.0.7", time.time() + 60)

    refused, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])
    other, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)],
                         client=("10.0.0.8", 1))

    assert (refused, other, to_django()) == (DATABASE, 304, {"address": 1})


@override_settings(BELLWETHER_PROXY_COUNT=1)
def test_the_refused_address_behind_a_proxy_is_the_forwarded_one(warm):
    throttling.blocked_addresses.block("203.0.113.9", time.time() + 60)
    headers = [*warm.headers, ("If-None-Match", warm.etag)]

    refused, _ = stack_poll(headers=[*headers, ("X-Forwarded-For", "203.0.113.9")])
    other, _ = stack_poll(headers=[*headers, ("X-Forwarded-For", "203.0.113.10")])

    assert (refused, other) == (DATABASE, 304)


@override_settings(SECURE_SSL_REDIRECT=True, SECURE_PROXY_SSL_HEADER=("HTTP_X_FORWARDED_PROTO",
                                                                      "https"))
def test_plain_http_goes_to_django_for_its_redirect_when_https_is_required(warm, to_django):
    headers = [*warm.headers, ("If-None-Match", warm.etag)]

    plain, _ = stack_poll(headers=headers)
    https, _ = stack_poll(headers=headers, scheme="https")
    proxied, _ = stack_poll(headers=[*headers, ("X-Forwarded-Proto", "https")])
    # As Django reads the header: the first of a list, around spaces.
    listed, _ = stack_poll(headers=[*headers, ("X-Forwarded-Proto", " https , http")])
    last, _ = stack_poll(headers=[*headers, ("X-Forwarded-Proto", "http, https")])

    assert (plain, https, proxied, listed, last, to_django()) == (
        DATABASE, 304, 304, 304, DATABASE, {"insecure": 2})


def test_a_cache_entry_gone_goes_to_django(warm, to_django):
    fleet_cache.forget_poll_states([warm.token.removeprefix("bwa_").split(".")[0]])

    status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert (status, to_django()) == (DATABASE, {"not_cached": 1})


def test_a_cache_down_goes_to_django(warm, to_django):
    with override_settings(CACHES={"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens here
    }}):
        status, _ = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)])

    assert (status, to_django()) == (DATABASE, {"not_cached": 1})


@pytest.mark.parametrize("kind", ["websocket", "lifespan"])
def test_other_protocols_go_to_the_application(kind):
    status, _ = stack_poll(kind=kind)

    assert status == HANDED_ON


# -- long-poll (?wait=N) -------------------------------------------------------------------


def _long_poll(warm, query, *, during=None, after_s=0.2):
    """stack_poll for a poll with `query`, running `during()` in a thread `after_s`
    seconds into the wait; returns (status, headers, seconds taken)."""
    timer = threading.Timer(after_s, during) if during else None
    started = time.monotonic()
    if timer:
        timer.start()
    try:
        status, headers = stack_poll(headers=[*warm.headers, ("If-None-Match", warm.etag)],
                                    query=query)
    finally:
        if timer:
            timer.join()
    return status, headers, time.monotonic() - started


@pytest.mark.slow
@override_settings(BELLWETHER_LONG_POLL_MAX_S=60)
def test_a_long_poll_is_304_at_the_end_of_its_wait_with_no_sql(warm, django_assert_num_queries):
    with django_assert_num_queries(0):
        status, headers, took = _long_poll(warm, b"wait=1")

    assert (status, headers["etag"], headers["bellwether-long-poll"]) == (304, warm.etag, "60")
    assert 0.9 <= took < 5
    assert longpoll._waiters.count() == 0


def test_a_change_announced_during_the_wait_ends_it_and_django_answers(warm):
    def change():
        fleet_cache.forget_poll_states([_key(warm)])
        announcements.announce([_key(warm)])

    status, _, took = _long_poll(warm, b"wait=20", during=change)

    assert status == DATABASE
    assert took < 5


def test_a_held_poll_owing_a_change_that_refills_nothing_goes_to_django_at_once(
        warm, monkeypatch, to_django):
    """A debt naming no generation (a mode, labels, a revoke: the answer is dropped,
    never refilled) sends a held poll to the database at once, not to wait for a refill."""
    monkeypatch.setattr(polldebt._debts, "_keys", frozenset({_key(warm)}))

    status, _, took = _long_poll(warm, b"wait=20")

    assert (status, took < 1, to_django()) == (DATABASE, True, {"stale": 1})


@pytest.mark.slow
def test_an_announcement_of_an_unchanged_answer_keeps_the_poll_waiting(warm):
    status, _, took = _long_poll(warm, b"wait=1",
                                 during=lambda: announcements.announce([_key(warm)]))

    assert status == 304
    assert took >= 0.9


@pytest.mark.slow
def test_an_announcement_for_other_agents_does_not_end_the_wait(warm):
    status, _, took = _long_poll(warm, b"wait=1",
                                 during=lambda: announcements.announce(["someoneelse"]))

    assert (status, took >= 0.9) == (304, True)


@pytest.mark.slow
@override_settings(BELLWETHER_LONG_POLL_MAX_S=60)
@pytest.mark.parametrize("query", [b"wait=0000000001", b"wait=" + b"0" * 40 + b"1"])
def test_leading_zeros_do_not_lengthen_a_wait(warm, query):
    status, _, took = _long_poll(warm, query)

    assert status == 304 and 0.9 <= took < 5  # its 1 s, not the 60 s maximum


@pytest.mark.slow
@override_settings(BELLWETHER_LONG_POLL_MAX_S=1)
def test_a_wait_above_the_maximum_is_served_as_the_maximum(warm):
    status, headers, took = _long_poll(warm, b"wait=" + b"9" * 40)

    assert (status, headers["bellwether-long-poll"]) == (304, "1")
    assert 0.9 <= took < 5


@override_settings(BELLWETHER_LONG_POLL_MAX_S=0)
def test_long_polling_off_answers_at_once_and_advertises_nothing(warm):
    status, headers, took = _long_poll(warm, b"wait=30")

    assert status == 304 and "bellwether-long-poll" not in headers
    assert took < 5


@pytest.mark.parametrize("query", [b"wait=abc", b"wait=-1", b"wait=1.5", b"wait=", b"wait",
                                   b"wait=1&wait=2", b"wait=1&x=2", b"WAIT=1", b"wait=%31",
                                   b"wait=\xd9\xa3"])
def test_a_wait_the_cache_cannot_read_goes_to_the_database(warm, query, to_django):
    status, _, took = _long_poll(warm, query)

    assert status == DATABASE and took < 5
    assert to_django() == {"request": 1}


def test_a_held_polls_wait_ends_at_its_time_or_when_its_key_is_announced():
    async def scenario():
        waiters = longpoll._Waiters()
        waiters._background = lambda: asyncio.sleep(3600)  # no announcements heard
        ended, woken = waiters.wait("k1", 1, 0.05), waiters.wait("k2", 2, 60)
        left = waiters.wait("k3", 3, 0.05)
        left.cancel()  # the client went away
        assert await ended is False and not woken.done()
        await asyncio.sleep(0.01)
        assert waiters.waiting_agents() == {2}  # the one that left is forgotten too
        waiters.wake(["k2"])
        assert await woken is True and waiters.count() == 0
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
    asyncio.run(scenario())


def test_host_decisions_are_remembered_boundedly_and_follow_the_settings(warm):
    """Django's ALLOWED_HOSTS decision is remembered per Host header (and scheme): a
    client sending ever new Host values never grows the memory past its bound, and
    a settings change decides again."""
    def polled(host):
        headers = [("Host", host), ("Authorization", f"Bearer {warm.token}"),
                   ("If-None-Match", warm.etag)]
        return stack_poll(headers=headers)[0]

    assert polled("testserver") == 304
    bound = cached._decided.cache_info().maxsize
    for i in range(bound * 3):
        assert polled(f"evil-{i}.example") == DATABASE
        assert cached._decided.cache_info().currsize <= bound
    assert polled("testserver") == 304
    with override_settings(ALLOWED_HOSTS=["elsewhere.example"]):
        assert polled("testserver") == DATABASE
    assert polled("testserver") == 304
