"""The agent poll's 304, answered in front of Django on the event loop.

Django's ASGI handler runs every request through a thread whenever a middleware is
synchronous (WhiteNoise is), which holds a web process to a few hundred polls a
second. `PollEdge` wraps the ASGI application: a GET or HEAD of
/api/v1/agent/desired that Django would answer 304 from the cache — a well-formed
agent token matching its cached poll state, an If-None-Match naming the cached
ETag, no poll debt the cached answer does not reflect (apps.fleet.polldebt), an
allowed Host, an address not refused for failed authentications — is answered
here with one cache read, no SQL and no thread (but for the periodic work of a
process: the poll that finds the poll debts due reads them on a thread, once a
second, and a heartbeat flush due runs on a thread, every few seconds). When the
If-None-Match names another ETag, the cached answer is sent as the 200 Django
would send (agentapi.pollanswer), so the polls after a change that refilled the
cache do not all go to the database. Every other request, and every doubt (a
header sent twice, a precondition Django would evaluate, the database failing),
goes to Django unchanged, which answers as before: 401 with the envelope (counted
by FailedAuthenticationMiddleware), 200 with the body, 429, 400, a redirect to
HTTPS.

A poll with `?wait=N` (agentapi.longpoll) that the edge would answer 304 is
held instead until the agent's token key is announced or N seconds (capped) pass:
on an announcement the edge decides again (still current: it waits on; a newer
cached answer: the edge sends it; otherwise Django answers, from the database), at
the end of the wait it answers 304.
"""

import asyncio
import time
from types import SimpleNamespace
from typing import NamedTuple

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest

from agentapi import longpoll, pollanswer
from apps.core import metrics, throttling, tokens
from apps.fleet import cache, heartbeats, polldebt, rules
from apps.fleet.authentication import agent_token_in

DESIRED_PATH = "/api/v1/agent/desired"
# The headers the decision reads; each must come at most once.
_READ = frozenset({b"authorization", b"if-none-match", b"host", b"x-forwarded-for",
                   b"x-forwarded-proto", b"accept"})
# Preconditions Django evaluates before If-None-Match (412): left to it.
_DJANGO_DECIDES = frozenset({b"if-match", b"if-unmodified-since"})


def _headers(scope) -> dict[bytes, str] | None:
    """The headers the decision reads, or None when one is repeated or a
    precondition only Django evaluates is present."""
    found: dict[bytes, str] = {}
    for name, value in scope.get("headers") or ():
        name = name.lower()
        if name in _DJANGO_DECIDES:
            return None
        if name in _READ:
            if name in found:
                return None
            found[name] = value.decode("latin-1")
    return found


def _decided_by_django(host: str | None, forwarded_proto: str | None,
                       scheme: str | None) -> tuple[bool, bool]:
    """(the Host is allowed, the request came over HTTPS), as Django's own
    HttpRequest.get_host() and is_secure() decide them."""
    request = HttpRequest()
    request._get_scheme = lambda: scheme or "http"  # what ASGIRequest reads from the scope
    request.META = {name: value for name, value in (
        ("HTTP_HOST", host), ("HTTP_X_FORWARDED_PROTO", forwarded_proto)) if value is not None}
    try:  # no Host at all (HTTP/1.1 requires one): whatever Django would do is its own
        allowed = host is not None and bool(request.get_host())
    except DisallowedHost:
        allowed = False
    return allowed, request.is_secure()


def host_and_scheme(scope, headers) -> tuple[bool, bool]:
    """Django's decisions for this request's Host and scheme, remembered by what they
    are decided on: a fleet sends the same one or two (at most DECISIONS_REMEMBERED,
    then forgotten together, since the headers are the client's to choose; all of
    them when settings change)."""
    asked = (headers.get(b"host"), headers.get(b"x-forwarded-proto"), scope.get("scheme"))
    decided = _decided.get(asked)
    if decided is None:
        if len(_decided) >= DECISIONS_REMEMBERED:
            _decided.clear()
        decided = _decided[asked] = _decided_by_django(*asked)
    return decided


def is_secure(scope, headers) -> bool:
    return host_and_scheme(scope, headers)[1]


DECISIONS_REMEMBERED = 64
_decided: dict[tuple, tuple[bool, bool]] = {}


@receiver(setting_changed)
def _settings_changed(**kwargs):
    _decided.clear()  # ALLOWED_HOSTS, DEBUG and SECURE_PROXY_SSL_HEADER decide them


def _address_refused(scope, headers) -> bool:
    client = scope.get("client")
    meta = {"REMOTE_ADDR": client[0] if client else "",
            "HTTP_X_FORWARDED_FOR": headers.get(b"x-forwarded-for", "")}
    address = throttling.client_ip(SimpleNamespace(META=meta))
    return throttling.blocked_addresses.wait(address, time.time()) is not None


def requested_wait(scope) -> int | None:
    """Seconds the poll may be held: 0 without a query string, N (capped) for
    exactly `wait=N`; None for anything else (Django answers: 400 naming `wait`
    for a bad number)."""
    query = scope.get("query_string") or b""
    if not query:
        return 0
    name, _, value = query.decode("latin-1").partition("=")
    return rules.poll_wait_seconds(value) if name == "wait" else None


def _json_get(scope, headers) -> bool | None:
    """For a GET whose Accept makes the API answer JSON, whether it came over HTTPS
    (Django's headers differ: HSTS); None for any other request."""
    if scope["method"] != "GET" or headers.get(b"accept") not in pollanswer.JSON_ACCEPTED:
        return None
    return is_secure(scope, headers)


class Current(NamedTuple):
    """What the edge answers 304 with, and whose change would end a wait; with a
    body, the 200 it answers instead (the If-None-Match names an older answer)."""

    key: str
    agent_id: int
    etag: str
    body: bytes | None = None


class ToDjango(NamedTuple):
    """Why Django answers this poll rather than the edge (counted by the reason:
    metrics.poll_to_django; the table in docs/operations.md says what each means)."""

    reason: str


class Refilling(NamedTuple):
    """A poll whose cached answer a poll debt distrusts: a committed change the
    cache does not reflect yet, whose refill (named by the debt's generation)
    announces the key when written."""

    key: str
    agent_id: int


async def current_answer(scope) -> Current | Refilling | ToDjango:
    """The poll's cached answer when it is 304, or 200 with the cached body when the
    edge may send it (agentapi.pollanswer), the heartbeat recorded; Refilling
    when the cache's answer is stale and being replaced; else why Django must
    answer."""
    if scope["method"] not in ("GET", "HEAD"):
        return ToDjango("request")
    headers = _headers(scope)
    if headers is None:
        return ToDjango("request")
    if b"if-none-match" not in headers:
        return ToDjango("no_validator")
    checked = await _checked_state(scope, headers)
    if isinstance(checked, ToDjango):
        return checked
    key, state, owed = checked
    if owed is None:
        return ToDjango("debt_unknown")
    if owed:
        return Refilling(key, state["agent_id"]) if polldebt.refilled(key) else ToDjango("stale")
    body = None
    if not rules.if_none_match_matches(headers[b"if-none-match"], state["etag"]):
        body = state.get("body")
        if not (body and pollanswer.may_send(_json_get(scope, headers), key, state["etag"])):
            return ToDjango("changed")
    _record_heartbeat(state["agent_id"], cache.renewal_key(key, state))
    return Current(key, state["agent_id"], state["etag"], body)


def headers_once(scope, names: frozenset[bytes]) -> dict[bytes, str] | None:
    """The headers of `names` the request sent, or None when one is repeated."""
    found: dict[bytes, str] = {}
    for name, value in scope.get("headers") or ():
        name = name.lower()
        if name in names:
            if name in found:
                return None
            found[name] = value.decode("latin-1")
    return found


async def vouched_state(scope, headers) -> tuple[str, dict] | None:
    """(token key, its cached poll state) when the cache vouches for the presented
    agent token — an allowed Host, an address not refused, HTTPS when required, the
    secret matching, no unsettled poll debt — or None. Every edge answer passes it
    (the poll's, agentapi.bundle_edge, agentapi.report_edge): a token the
    cache does not vouch for goes to Django, so a revoked, rotated or decommissioned
    token meets Django (401) from its next request."""
    checked = await _checked_state(scope, headers)
    if isinstance(checked, ToDjango) or checked[2] is not False:
        return None
    return checked[:2]


async def _checked_state(scope, headers) -> tuple[str, dict, bool | None] | ToDjango:
    """vouched_state's checks but the poll debt's, and what the debt says of the
    cached state (True: stale; None: the database could not say); or the check
    that failed."""
    host_allowed, secure = host_and_scheme(scope, headers)
    if not host_allowed:
        return ToDjango("host")
    if _address_refused(scope, headers):
        return ToDjango("address")
    if settings.SECURE_SSL_REDIRECT and not secure:
        return ToDjango("insecure")
    parsed = agent_token_in(headers.get(b"authorization", ""))
    if parsed is None:
        return ToDjango("token")
    key, secret = parsed
    state = await cache.poll_state_async(key)
    if state is None:
        return ToDjango("not_cached")
    if not tokens.secret_matches(secret, state["token_hash"]):
        return ToDjango("secret")
    return key, state, await _owes(key, state.get("generation"))


async def _owes(key: str, generation: int | None) -> bool | None:
    """Whether the token's cached answer (computed at `generation`) may be stale;
    None when the database could not say. Debts due for their refresh (once a
    second per process) are read on a thread by the poll that finds them due."""
    owed = polldebt.owes_known(key, generation)
    if owed is None:
        owed, failure = await asyncio.to_thread(polldebt.owes, key, generation)
        return None if failure is not None else owed
    return owed


_flushes: set[asyncio.Future] = set()


def _record_heartbeat(agent_id: int, renew: str | None) -> None:
    """Buffer the heartbeat (renewing the poll state of token key `renew`); when the
    buffer is due for its flush (every few seconds per process), flush it on a
    thread, as the view does."""
    if not cache.heartbeat_noted(agent_id, renew):
        flush = asyncio.get_running_loop().run_in_executor(None, heartbeats.heartbeat_record,
                                                           agent_id, renew)
        _flushes.add(flush)
        flush.add_done_callback(_flushes.discard)


# How long a held poll whose cached answer is being refilled waits for the refill
# when this process hears no announcement at all (a refill announces each chunk as
# it writes it): then the refill is taken for stalled or lost and Django answers
# from the database (up to longpoll.TICK_S later: waits end on the second).
REFILL_WAIT_S = 2.0


async def held_answer(scope) -> Current | ToDjango:
    """For a poll with ?wait=N: the answer to give at the end of the wait (304), or
    why Django must answer, as soon as it must (the desired state may have
    changed). A poll arriving while a change's refill is under way (its cached
    answer stale) waits for it while the refill is heard from, rather than go to
    the database with the change's whole storm: a slow refill (a loaded machine,
    a slow database) must not be joined by every agent reading the same database.
    A plain poll (no wait) goes to Django at once."""
    wait = requested_wait(scope)
    if wait is None:
        return ToDjango("request")
    loop = asyncio.get_running_loop()
    deadline, refilling_since, woken = loop.time() + wait, None, None
    try:
        while True:
            current = await current_answer(scope)
            longpoll.answered(woken)  # read: bundles and reports waiting for it may go
            woken = None
            refilling = isinstance(current, Refilling)
            if refilling:
                refilling_since = refilling_since or loop.time()
                quiet_since = max(refilling_since, longpoll.heard_at())
                until = min(quiet_since + REFILL_WAIT_S, deadline)
            elif isinstance(current, ToDjango) or current.body is not None or not wait:
                return current
            else:
                refilling_since, until = None, deadline
            remaining = until - loop.time()
            if remaining <= 0:
                return ToDjango("refilling" if wait else "stale") if refilling else current
            woken = longpoll.wait_for_change(current.key, current.agent_id, remaining)
            if not await woken and not refilling:
                return current
    finally:
        longpoll.answered(woken)


def long_poll_header() -> list[tuple[bytes, bytes]]:
    cap = settings.BELLWETHER_LONG_POLL_MAX_S
    return [(b"bellwether-long-poll", str(cap).encode())] if cap else []


class PollEdge:
    """ASGI middleware: answers the poll's 304 (holding a long-poll first), or its
    200 from the cache, when it can; hands on the rest."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == DESIRED_PATH:
            current = await held_answer(scope)
            if isinstance(current, ToDjango):
                metrics.poll_to_django(current.reason)
                headers = _headers(scope)
                send = _counting_polls(pollanswer.learning(
                    send, None if headers is None else _json_get(scope, headers)))
            elif current.body is not None:
                metrics.poll_answered(200)
                return await pollanswer.send_changed(
                    send, _json_get(scope, _headers(scope)), current.key, current.etag,
                    current.body)
            else:
                await send({"type": "http.response.start", "status": 304, "headers": [
                    (b"etag", current.etag.encode("latin-1")),
                    (b"cache-control", b"no-cache"), *long_poll_header()]})
                await send({"type": "http.response.body", "body": b""})
                metrics.poll_answered(304)
                return None
        return await self.app(scope, receive, send)


def _counting_polls(send):
    """`send`, counting the poll Django answers by its status."""
    async def counted(message):
        if message["type"] == "http.response.start":
            metrics.poll_answered(message["status"])
        await send(message)
    return counted
