"""A snapshot's bundle, answered in front of Django on the event loop once Django has
answered that snapshot's bundle in this process.

A snapshot's content never changes: Django's answer to GET
/api/v1/agent/snapshots/<n>/bundle (the stored gzip bytes, with every header the
view and the middleware set) is its answer to every agent of the environment that
desires that snapshot. `BundleEdge` keeps Django's 200 and 304 by what they hold —
(environment, number, checksum, HTTPS): a rollback's snapshot has an older one's
checksum under a number of its own — at most ANSWERS_MAX_BYTES of bodies per process,
the least recently used dropped first, and replays them, with no SQL and no thread,
to a request that

- is a GET with no query string of a number up to MAX_NUMBER, accepting gzip, with
  no `Accept` or one DRF answers with JSON, and no precondition Django evaluates;
- passes the checks of the poll's 304 (agentapi.edge): an allowed Host, an
  address not refused, HTTPS when required, an agent token matching its cached poll
  state with no unsettled poll debt (apps.fleet.polldebt) — so a revoked, rotated or
  decommissioned token goes to Django (401) from its next request, as on the poll;
- asks for the snapshot that poll state desires (its number, and its checksum, which
  keys the answer with the number): a snapshot an agent desires cannot be removed
  (apps.releases.retention), and a change of what it desires distrusts the cached
  state until it is written anew, so a removed or retained-away snapshot's number
  never reaches a kept answer — any other number is Django's (404 once removed);
- is within the agent's API rate (AgentRateThrottle's count, in its cache key).

304 when If-None-Match names the representation's ETag (as Django decides it:
apps.fleet.rules.if_none_match_matches), else 200. Everything else — the first
request for a snapshot in this process (the others arriving meanwhile wait for its
answer), a client refusing gzip, a token the cache does not vouch for, a throttled
agent, another environment's or an unready snapshot — goes to Django unchanged,
which answers as before (401, 404, 406, 429 with the error envelope).
"""

import asyncio
import contextlib
import json
import re
import threading
from collections import OrderedDict
from types import SimpleNamespace
from typing import NamedTuple

from django.conf import settings
from django.core.cache.backends.redis import RedisSerializer

from agentapi import edge, longpoll
from agentapi.pollanswer import PER_REQUEST
from apps.core.breaker import best_effort_redis
from apps.core.compression import accepts_gzip
from apps.core.throttling import AgentRateThrottle
from apps.fleet import cache, rules

BUNDLE_PATH = re.compile(r"/api/v1/agent/snapshots/([0-9]{1,10})/bundle")
MAX_NUMBER = 2**31 - 1  # a snapshot's number is a PositiveIntegerField
ANSWERS_MAX_BYTES = 64 * 1024 * 1024
# Per kept answer beyond its bytes: the tuple, the dict entry, the key and the bytes objects.
ANSWER_OVERHEAD = 512
# `Accept` values for which DRF's negotiation lets the view answer (others may be 406).
_JSON_ACCEPTED = frozenset({None, "*/*", "application/json"})
_ALSO_READ = frozenset({b"accept", b"accept-encoding"})


class BundleAsk(NamedTuple):
    agent_id: int
    key: tuple[int, int, str, bool]  # (environment id, number, checksum, HTTPS)
    if_none_match: str | None


class Answer(NamedTuple):
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    @property
    def size(self) -> int:
        """What keeping it costs, about: its bytes and a fixed share for the objects."""
        return ANSWER_OVERHEAD + len(self.body) + sum(len(n) + len(v) for n, v in self.headers)


def requested_number(scope) -> int | None:
    """The snapshot number of a GET of a bundle with no query string, or None (a
    longer number than any snapshot's is Django's: 404)."""
    if scope["method"] != "GET" or scope.get("query_string"):
        return None
    match = BUNDLE_PATH.fullmatch(scope["path"])
    if match is None:
        return None
    number = int(match[1])
    return number if 1 <= number <= MAX_NUMBER else None


async def bundle_ask(scope) -> BundleAsk | None:
    """The bundle request, when the edge may answer it (Django's earlier answer
    permitting), or None when it is Django's."""
    number = requested_number(scope)
    if number is None:
        return None
    headers, negotiation = edge._headers(scope), edge.headers_once(scope, _ALSO_READ)
    if headers is None or negotiation is None:
        return None
    if negotiation.get(b"accept") not in _JSON_ACCEPTED:
        return None
    if not accepts_gzip(negotiation.get(b"accept-encoding")):
        return None  # the identity bytes are Django's: agents ask for gzip
    vouched = await edge.vouched_state(scope, headers)
    if vouched is None:
        return None
    state = vouched[1]
    environment_id = state.get("environment_id")
    desired = desired_snapshot(state)
    if environment_id is None or desired is None or desired[0] != number:
        return None
    key = (environment_id, number, desired[1], edge.is_secure(scope, headers))
    return BundleAsk(state["agent_id"], key, headers.get(b"if-none-match"))


def desired_snapshot(state: dict) -> tuple[int, str] | None:
    """(number, checksum) of the snapshot a cached poll state desires, or None."""
    try:
        snapshot = json.loads(state["body"])["snapshot"]
        return (snapshot["number"], snapshot["checksum"]) if snapshot else None
    except (KeyError, TypeError, ValueError):
        return None


class _Answers:
    """Django's 200 and 304 per BundleAsk key, the least recently used dropped first
    once their sizes (body, headers, objects) pass `max_bytes`."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple, dict[int, Answer]] = OrderedDict()
        self._bytes = 0

    def get(self, key) -> dict[int, Answer]:
        with self._lock:
            answers = self._kept.get(key)
            if answers is None:
                return {}
            self._kept.move_to_end(key)
            return dict(answers)

    def keep(self, key, answer: Answer) -> None:
        if answer.size > self.max_bytes:
            return
        with self._lock:
            answers = self._kept.setdefault(key, {})
            replaced = answers.get(answer.status)
            self._bytes += answer.size - (replaced.size if replaced else 0)
            answers[answer.status] = answer
            self._kept.move_to_end(key)
            while self._bytes > self.max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= sum(a.size for a in dropped.values())

    def forget(self) -> None:
        with self._lock:
            self._kept.clear()
            self._bytes = 0


def replayed(answers: dict[int, Answer], if_none_match: str | None) -> Answer | None:
    """Django's answer to this request when it gave one already: its 304 when
    If-None-Match names the representation's ETag, its 200 otherwise."""
    if if_none_match is None:
        return answers.get(200)
    etag = next((value.decode("latin-1") for answer in answers.values()
                 for name, value in answer.headers if name.lower() == b"etag"), None)
    if etag is None:
        return None
    return answers.get(304 if rules.if_none_match_matches(if_none_match, etag) else 200)


_redis_serializer = RedisSerializer()
# The rate keys whose count a request of this process is reading and writing now.
_counting: dict[str, asyncio.Future] = {}


class _ReadAhead:
    """The throttle's cache for one decision: the history read beforehand, the write
    kept to be sent after (the edge's cache calls are asynchronous, DRF's are not)."""

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


_answers = _Answers(ANSWERS_MAX_BYTES)


def forget() -> None:
    """Drop what this process keeps (tests: ids are reused from test to test)."""
    _answers.forget()


# The bundle requests Django is answering now, per BundleAsk key: after a publish
# every agent asks for the same new bundle within a second, and all but the first
# wait for Django's answer to it (then replayed) instead of all going to Django.
_answering: dict[tuple, asyncio.Future] = {}
FIRST_ANSWER_WAIT_S = 10.0


async def _first_answer(key) -> None:
    """Wait for Django's answer to the request of `key` it is answering, if any."""
    first = _answering.get(key)
    if first is not None and first.get_loop() is asyncio.get_running_loop():
        # asyncio.timeout, not wait_for: thousands wait here after a publish, and
        # wait_for costs a task-like wrapper each.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(FIRST_ANSWER_WAIT_S):
                await asyncio.shield(first)


async def _answered_by_django(app, scope, receive, send, ask: BundleAsk):
    """Django answers; its 200 or 304 (setting no cookie) is kept for `ask.key`."""
    start, body = None, []
    loop = asyncio.get_running_loop()
    answering = _answering.get(ask.key)
    if answering is None or answering.get_loop() is not loop:  # resolved on its own loop
        answering = _answering[ask.key] = loop.create_future()

    async def keeping(message):
        nonlocal start
        if message["type"] == "http.response.start":
            start = message
        elif message["type"] == "http.response.body":
            body.append(message.get("body", b""))
        await send(message)

    try:
        result = await app(scope, receive, keeping)
        if start is not None and start["status"] in (200, 304) and not any(
                name.lower() == b"set-cookie" for name, _ in start.get("headers", ())):
            _answers.keep(ask.key, Answer(start["status"], [
                (bytes(n), bytes(v)) for n, v in start["headers"]
                if n.lower() not in PER_REQUEST], b"".join(body)))
        return result
    finally:  # the requests waiting for this answer (kept, or not: then Django's)
        if _answering.get(ask.key) is answering:
            del _answering[ask.key]
            answering.set_result(None)


class BundleEdge:
    """ASGI middleware: replays Django's bundle answers when it may, hands on the rest
    (and keeps Django's answers to the bundle requests it may replay later)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        ask = await bundle_ask(scope) if scope["type"] == "http" else None
        if ask is None:
            return await self.app(scope, receive, send)
        await longpoll.woken_polls_first()
        answer = replayed(_answers.get(ask.key), ask.if_none_match)
        if answer is None:
            await _first_answer(ask.key)
            answer = replayed(_answers.get(ask.key), ask.if_none_match)
        if answer is not None and await within_rate(ask.agent_id):
            await send({"type": "http.response.start", "status": answer.status,
                        "headers": answer.headers})
            await send({"type": "http.response.body", "body": answer.body})
            return None
        return await _answered_by_django(self.app, scope, receive, send, ask)
