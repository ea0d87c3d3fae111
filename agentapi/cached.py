"""GET /api/v1/agent/desired, the agent's poll, answered on the event loop: its 304
(held first for `?wait=N`: agentapi.longpoll), or its 200, from the agent's cached
poll state with one cache read when the cache vouches for the token, else from the
database on a lent thread (agentapi.desired). docs/design.md, "The hot path".
"""

import asyncio
import functools
import time
from types import SimpleNamespace
from typing import NamedTuple

from django.conf import settings
from django.core.cache.backends.redis import RedisSerializer
from django.core.exceptions import DisallowedHost
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest

from agentapi import checks, desired, longpoll
from apps.core import metrics, throttling, tokens
from apps.core.breaker import best_effort_redis
from apps.core.throttling import AgentRateThrottle
from apps.fleet import cache, heartbeats, polldebt, rules
from apps.fleet.authentication import agent_token_in

DESIRED_PATH = "/api/v1/agent/desired"
# The headers the decision reads; each must come at most once.
_READ = frozenset({b"authorization", b"if-none-match", b"host", b"x-forwarded-for",
                   b"x-forwarded-proto"})
# Preconditions evaluated before If-None-Match (412): by the database's answer.
_PRECONDITIONS = frozenset({b"if-match", b"if-unmodified-since"})


def _headers(scope) -> dict[bytes, str] | None:
    """The headers the decision reads, or None when one is repeated or a
    precondition only Django's conditional rules evaluate is present (the
    database's answer evaluates it)."""
    found = headers_once(scope, _READ | _PRECONDITIONS)
    return None if found is None or _PRECONDITIONS & found.keys() else found


def host_and_scheme(scope, headers) -> tuple[bool, bool]:
    """(the Host is allowed, the request came over HTTPS) for this request."""
    return _decided(headers.get(b"host"), headers.get(b"x-forwarded-proto"),
                    scope.get("scheme"))


# Remembered by what they are decided on: a fleet sends the same one or two, and the
# headers are the client's to choose (so a bounded memory), forgotten when settings
# change (ALLOWED_HOSTS, DEBUG and SECURE_PROXY_SSL_HEADER decide them).
@functools.lru_cache(maxsize=64)
def _decided(host: str | None, forwarded_proto: str | None,
             scheme: str | None) -> tuple[bool, bool]:
    """As Django's own HttpRequest.get_host() and is_secure() decide them."""
    request = HttpRequest()
    request._get_scheme = lambda: scheme or "http"  # what ASGIRequest reads from the scope
    request.META = {name: value for name, value in (
        ("HTTP_HOST", host), ("HTTP_X_FORWARDED_PROTO", forwarded_proto)) if value is not None}
    try:  # no Host at all (HTTP/1.1 requires one): whatever Django would do is its own
        allowed = host is not None and bool(request.get_host())
    except DisallowedHost:
        allowed = False
    return allowed, request.is_secure()


@receiver(setting_changed)
def _settings_changed(**kwargs):
    _decided.cache_clear()


def _address_refused(scope, headers) -> bool:
    client = scope.get("client")
    meta = {"REMOTE_ADDR": client[0] if client else "",
            "HTTP_X_FORWARDED_FOR": headers.get(b"x-forwarded-for", "")}
    address = throttling.client_ip(SimpleNamespace(META=meta))
    return throttling.blocked_addresses.wait(address, time.time()) is not None


class Current(NamedTuple):
    """What the cache answers 304 with, and whose change would end a wait; with a
    body, the 200 it answers instead (the If-None-Match names an older answer)."""

    key: str
    agent_id: int
    etag: str
    body: bytes | None = None


class Uncached(NamedTuple):
    """Why the database answers this poll, not the cache (counted by the reason:
    metrics.poll_from_database; the table in docs/operations.md says what each means)."""

    reason: str


class Refilling(NamedTuple):
    """A poll whose cached answer a poll debt distrusts: a committed change the
    cache does not reflect yet, whose refill (named by the debt's generation)
    announces the key when written."""

    key: str
    agent_id: int


async def current_answer(scope) -> Current | Refilling | Uncached:
    """The poll's cached answer (304, or 200 with the cached body when If-None-Match
    names another), its heartbeat recorded; Refilling when the cached answer is
    stale and being replaced; else why the database answers."""
    if scope["method"] not in ("GET", "HEAD"):
        return Uncached("request")
    headers = _headers(scope)
    if headers is None:
        return Uncached("request")
    if b"if-none-match" not in headers:
        return Uncached("no_validator")
    checked = await _checked_state(scope, headers)
    if isinstance(checked, Uncached):
        return checked
    key, state, owed = checked
    if owed is None:
        return Uncached("debt_unknown")
    if owed:
        return Refilling(key, state["agent_id"]) if polldebt.refilled(key) else Uncached("stale")
    body = None
    if not rules.if_none_match_matches(headers[b"if-none-match"], state["etag"]):
        body = state.get("body")
        if not (body and scope["method"] == "GET"):
            return Uncached("changed")
    _record_heartbeat(state["agent_id"])
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
    agent token (an allowed Host, an address not refused, HTTPS when required, the
    secret matching, no unsettled poll debt), else None: the database decides."""
    checked = await _checked_state(scope, headers)
    if isinstance(checked, Uncached) or checked[2] is not False:
        return None
    return checked[:2]


async def _checked_state(scope, headers) -> tuple[str, dict, bool | None] | Uncached:
    """vouched_state's checks but the debt's, with what the debt says (True: stale;
    None: unknown); or the check that failed."""
    host_allowed, secure = host_and_scheme(scope, headers)
    if not host_allowed:
        return Uncached("host")
    if _address_refused(scope, headers):
        return Uncached("address")
    if settings.SECURE_SSL_REDIRECT and not secure:
        return Uncached("insecure")
    parsed = agent_token_in(headers.get(b"authorization", ""))
    if parsed is None:
        return Uncached("token")
    key, secret = parsed
    state = await cache.poll_state_async(key)
    if state is None:
        return Uncached("not_cached")
    if not tokens.secret_matches(secret, state["token_hash"]):
        return Uncached("secret")
    return key, state, await _owes(key, state.get("generation"))


async def _owes(key: str, generation: int | None) -> bool | None:
    """polldebt.owes, on a thread only when the debts are due for their refresh."""
    owed = polldebt.owes_known(key, generation)
    if owed is None:
        owed = await asyncio.to_thread(polldebt.owes, key, generation)
    return owed


def _record_heartbeat(agent_id: int) -> None:
    """Buffer the heartbeat; when the buffer is due for its flush, flush it on a thread."""
    if not cache.heartbeat_noted(agent_id):
        asyncio.get_running_loop().run_in_executor(None, heartbeats.heartbeat_record, agent_id)


# A held poll meeting a refill waits for it while this process hears announcements
# (a refill announces each chunk it writes); this long without one, the database answers.
REFILL_WAIT_S = 2.0


async def held_answer(scope) -> Current | Uncached:
    """The cached answer at the end of the poll's wait (`?wait=N`), or as soon as
    the database must answer, why. A long-poll meeting a refill under way waits for
    it rather than join a publish's storm on the database; a plain poll does not."""
    wait = desired.requested_wait(scope.get("query_string") or b"")
    if isinstance(wait, tuple):
        return Uncached("request")
    loop = asyncio.get_running_loop()
    deadline, refilling_since = loop.time() + wait, None
    while True:
        current = await current_answer(scope)
        refilling = isinstance(current, Refilling)
        if refilling:
            refilling_since = refilling_since or loop.time()
            quiet_since = max(refilling_since, longpoll.heard_at())
            until = min(quiet_since + REFILL_WAIT_S, deadline)
        elif isinstance(current, Uncached) or current.body is not None or not wait:
            return current
        else:
            refilling_since, until = None, deadline
        remaining = until - loop.time()
        if remaining <= 0:
            return Uncached("refilling" if wait else "stale") if refilling else current
        woken = longpoll.wait_for_change(current.key, current.agent_id, remaining)
        if not await woken and not refilling:
            return current


async def answer_poll(scope, receive, send) -> None:
    """The poll's answer, from the cache when it can, else from the database."""
    current = await held_answer(scope)
    if isinstance(current, Uncached):
        metrics.poll_from_database(current.reason)
        status = await checks.answered_on_thread(scope, send, desired.METHODS,
                                                 desired.desired_answer)
        metrics.poll_answered(status)
        return
    metrics.poll_answered(304 if current.body is None else 200)
    headers = [(b"etag", current.etag.encode("latin-1")), (b"cache-control", b"no-cache"),
               *desired.long_poll_header()]
    if current.body is not None:
        headers += [(b"content-type", b"application/json"),
                    (b"content-length", str(len(current.body)).encode())]
    await send({"type": "http.response.start", "status": 304 if current.body is None
                else 200, "headers": headers})
    await send({"type": "http.response.body", "body": current.body or b""})


_redis_serializer = RedisSerializer()
# The rate keys whose count a request of this process is reading and writing now.
_counting: dict[str, asyncio.Future] = {}


class _ReadAhead:
    """The throttle's cache for one decision: the history read beforehand, the write
    kept to be sent after (these cache calls are asynchronous, DRF's are not)."""

    def __init__(self, history: list):
        self.history, self.written = history, None

    def get(self, key, default=None):
        return self.history

    def set(self, key, value, timeout=None):
        self.written = (value, timeout)


async def within_rate(agent_id: int) -> bool:
    """AgentRateThrottle's own decision on the agent's request times, read from its
    cache key before and written back after without a thread; True when no rate is
    set or the cache fails (as the throttle), False over the rate (Django: 429).
    One agent's requests are counted one after another in this process: requests
    sent at once would otherwise read the same count in one round trip and each
    write it plus one (as DRF's read-then-write does across processes)."""
    throttle = AgentRateThrottle()
    if settings.BELLWETHER_THROTTLE_RATES.get(throttle.scope) is None:
        return True  # (no read either)
    caller = SimpleNamespace(user=SimpleNamespace(agent=SimpleNamespace(pk=agent_id)))
    redis = cache.async_redis()
    if redis is None:  # local memory: no I/O
        return throttle.allow_request(caller, None)
    if not best_effort_redis.allows():
        return True
    backend, batched = redis
    key = backend.make_and_validate_key(throttle.get_cache_key(caller, None))
    loop = asyncio.get_running_loop()
    while (earlier := _counting.get(key)) is not None and earlier.get_loop() is loop:
        await earlier
    _counting[key] = counted = loop.create_future()
    try:
        raw = await batched.get(backend, key)
        throttle.cache = _ReadAhead([] if raw is None else _redis_serializer.loads(raw))
        if not throttle.allow_request(caller, None):
            return False
        if throttle.cache.written is not None:
            history, timeout = throttle.cache.written
            await batched.set(backend, key, _redis_serializer.dumps(history), timeout)
    except Exception as exc:  # noqa: BLE001 - a cache down must not refuse requests
        best_effort_redis.failed(exc)
    finally:
        if _counting.get(key) is counted:
            del _counting[key]
        counted.set_result(None)
    return True
