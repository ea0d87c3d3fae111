"""What the agent poll path keeps in the cache: per token, the agent's current answer
(ETag and body); per agent, its last heartbeat. The database stays the source of truth: a miss or
an outage of the cache falls back to it, and cache errors never fail a request."""

import asyncio
import logging
import threading
import time
import zlib

import redis.asyncio
from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache, RedisSerializer
from django.core.signals import setting_changed
from django.dispatch import receiver

logger = logging.getLogger(__name__)

_shared = None


def _cache():
    """One cache client per process. Django's `cache` is per async context, so
    under ASGI every request would build a new Redis connection pool."""
    global _shared
    if _shared is None:
        _shared = caches.create_connection("default")
    return _shared


@receiver(setting_changed)
def _settings_changed(*, setting, **kwargs):
    global _shared
    if setting == "CACHES":
        _shared = None

# A poll state lives 30 to 60 minutes from its write, the span fixed by its token key:
# a refill's agents go back to the database over half an hour, not at once. A stale
# answer is bounded by its change's PollInvalidation row (apps.fleet.polldebt); one
# written wrongly after the sweep lives out its lifetime.
POLL_STATE_LIFETIME_S = 1800
HEARTBEAT_TTL = 24 * 3600


def _poll_key(token_key: str) -> str:
    return f"fleet:poll:{token_key}"


def _seen_key(agent_id: int) -> str:
    return f"fleet:seen:{agent_id}"


def _get_many(keys: list[str]) -> dict:
    """get_many of keys made here, without Django's per-key memcached checks (40 ms
    for a rollout's 10,000 heartbeats)."""
    backend = _cache()
    if not isinstance(backend, RedisCache):
        return backend.get_many(keys)
    made = {backend.make_key(key): key for key in keys}
    return {made[key]: value for key, value in backend._cache.get_many(list(made)).items()}


def poll_state(token_key: str) -> dict | None:
    try:
        return _cache().get(_poll_key(token_key))
    except Exception:
        logger.warning("cache unavailable; answering polls from the database", exc_info=True)
        return None


class _AsyncRedis:
    """agentapi's reads and writes without a thread (agentapi.cached, agentapi.bundle): through
    redis.asyncio, on the event loop they run on. Reads go out as one MGET, writes as
    one pipeline, at most one of each in flight: what is asked meanwhile waits for it
    and goes out together next, so that under load many requests share a round trip and
    the connections stay two, however many requests wait. redis-py spends about 0.1 ms
    of CPU on a command sent alone, a few microseconds on a key of an MGET; and its pool
    opens at most 100 connections, refusing the next command (after a publish every
    agent's bundle and report read and write its API rate at once)."""

    def __init__(self):
        self._for: tuple | None = None  # (backend, loop) the client and queues are of
        self._client = None
        self._reads: list[tuple[str, asyncio.Future]] = []
        self._writes: list[tuple[str, bytes, int, asyncio.Future]] = []
        self._reader: asyncio.Task | None = None
        self._writer: asyncio.Task | None = None

    @staticmethod
    def connect(backend: RedisCache):
        options = backend._options
        return redis.asyncio.Redis.from_url(
            backend._servers[0], socket_timeout=options.get("socket_timeout"),
            socket_connect_timeout=options.get("socket_connect_timeout"))

    def _adopt(self, backend: RedisCache) -> asyncio.AbstractEventLoop:
        loop = asyncio.get_running_loop()
        if self._for != (backend, loop):  # a new loop or cache (tests): nothing old is kept
            self._for, self._client = (backend, loop), self.connect(backend)
            self._reads, self._writes, self._reader, self._writer = [], [], None, None
        return loop

    async def get(self, backend: RedisCache, key: str) -> bytes | None:
        """The stored bytes of a made key (None: none), read with the other reads
        waiting; raises CacheUnavailable when Redis failed."""
        loop = self._adopt(backend)
        answer = loop.create_future()
        self._reads.append((key, answer))
        if self._reader is None:
            self._reader = loop.create_task(self._drain("_reads", self._mget))
        return _unless_failed(await answer)

    async def set(self, backend: RedisCache, key: str, value: bytes, seconds: int) -> None:
        """Store `value` under a made key for `seconds`, with the other writes
        waiting; raises CacheUnavailable when Redis failed."""
        loop = self._adopt(backend)
        done = loop.create_future()
        self._writes.append((key, value, seconds, done))
        if self._writer is None:
            self._writer = loop.create_task(self._drain("_writes", self._pipeline))
        _unless_failed(await done)

    async def _drain(self, queue: str, send) -> None:
        """Send the queue's waiting entries, one round trip at a time, until none is
        left (the task starts on the next loop turn: those of this turn go together)."""
        owner, client, task = self._for, self._client, asyncio.current_task()
        try:
            while self._for == owner and (waiting := getattr(self, queue)):
                setattr(self, queue, [])
                await send(client, waiting)
        finally:
            if self._reader is task:
                self._reader = None
            if self._writer is task:
                self._writer = None

    @staticmethod
    async def _mget(client, waiting) -> None:
        try:
            values = await client.mget([key for key, _ in waiting])
        except Exception:
            logger.warning("cache unavailable; %d read(s) failed", len(waiting), exc_info=True)
            values = [_FAILED] * len(waiting)
        for (_, answer), value in zip(waiting, values, strict=True):
            if not answer.done():
                answer.set_result(value)

    @staticmethod
    async def _pipeline(client, waiting) -> None:
        try:
            async with client.pipeline(transaction=False) as pipe:
                for key, value, seconds, _ in waiting:
                    pipe.set(key, value, ex=seconds)
                await pipe.execute()
            outcome = None
        except Exception:
            logger.warning("cache unavailable; %d write(s) failed", len(waiting), exc_info=True)
            outcome = _FAILED
        for *_, done in waiting:
            if not done.done():
                done.set_result(outcome)


class CacheUnavailable(Exception):
    """Redis failed a read or write of agentapi (logged once per round trip)."""


_FAILED = object()


def _unless_failed(outcome):
    if outcome is _FAILED:
        # A new one per caller: one instance raised for many would grow its traceback.
        raise CacheUnavailable("the round trip failed (logged)")
    return outcome


_async_redis = _AsyncRedis()
_serializer = RedisSerializer()


async def poll_state_async(token_key: str) -> dict | None:
    """poll_state() for an event loop: never blocks it, never needs a thread; its
    read shares a round trip with the others waiting (`_AsyncRedis`). A
    local-memory cache is read directly (no I/O)."""
    backend = _cache()
    if not isinstance(backend, RedisCache):
        return poll_state(token_key)
    # make_key, not make_and_validate_key: the key is ours (a prefix and a
    # 16-character token key), and the memcached checks cost more than the read.
    try:
        raw = await _async_redis.get(backend, backend.make_key(_poll_key(token_key)))
    except CacheUnavailable:
        return None  # the database answers
    return None if raw is None else _serializer.loads(raw)


def poll_state_of(*, token_hash: str, agent_id: int, environment_id: int, etag: str,
                  generation: int | None = None, body: bytes | None = None) -> dict:
    """What the cache keeps of an agent's poll answer: whose token it is (the agent
    and its environment, which never changes: the bundle route's check), its ETag
    and rendered body, and the agent's generation it was computed at (a poll debt
    trusts an answer computed at the generation its change reached, or later; one
    of unknown generation, never)."""
    return {"agent_id": agent_id, "environment_id": environment_id, "token_hash": token_hash,
            "etag": etag, "generation": generation, "body": body}


def poll_state_lifetime(token_key: str) -> int:
    return int(POLL_STATE_LIFETIME_S * (1 + zlib.crc32(token_key.encode()) % 1024 / 1024))


def store_poll_state(*, token_key: str, **answer) -> None:
    """Write one agent's poll state (poll_state_of's arguments)."""
    store_poll_states({token_key: poll_state_of(**answer)})


def store_poll_states(states: dict[str, dict]) -> bool:
    """Write many agents' poll states (token key -> state) in one round trip, each
    for its lifetime; False when the cache failed."""
    backend = _cache()
    try:
        if not isinstance(backend, RedisCache):  # local memory: no I/O
            for key, state in states.items():
                backend.set(_poll_key(key), state, timeout=poll_state_lifetime(key))
            return True
        with backend._cache.get_client(write=True).pipeline(transaction=False) as pipeline:
            for key, state in states.items():
                pipeline.set(backend.make_key(_poll_key(key)), _serializer.dumps(state),
                             ex=poll_state_lifetime(key))
            pipeline.execute()
        return True
    except Exception:
        logger.warning("cache unavailable; %d poll state(s) not stored", len(states),
                       exc_info=True)
        return False


def forget_poll_states(token_keys) -> bool:
    """Drop these agents' poll states; False when the cache failed. Best effort:
    what makes a change reach its agents whatever the cache does is the change's
    PollInvalidation row (apps.fleet.polldebt), settled by a later sweep."""
    keys = [_poll_key(k) for k in token_keys]
    if not keys:
        return True
    try:
        _cache().delete_many(keys)
        return True
    except Exception:
        logger.warning("cache unavailable; %d poll state(s) not dropped yet (their agents "
                       "are answered from the database until a sweep drops them)",
                       len(keys), exc_info=True)
        return False


def forget_poll_states_before(required: dict[str, int | None]) -> bool:
    """Drop the poll states computed before the generation `required` names for
    their token key (all of a key that names None); False when the cache failed.
    A state at that generation or later reflects the change and stays: settling a
    refilled change sends no agent to the database."""
    outright = [k for k, generation in required.items() if generation is None]
    checked = {k: generation for k, generation in required.items() if generation is not None}
    try:
        found = _get_many([_poll_key(k) for k in checked]) if checked else {}
    except Exception:
        logger.warning("cache unavailable; %d poll state(s) not checked", len(checked),
                       exc_info=True)
        return False
    stale = [k for k, generation in checked.items()
             if ((found.get(_poll_key(k)) or {}).get("generation") or 0) < generation]
    return forget_poll_states(outright + stale)


class _HeartbeatBuffer:
    """Heartbeats of this process, written to the cache in one batch at most every
    FLUSH_S seconds: a poll costs one cache read, not a read and a write."""

    FLUSH_S = 5.0

    def __init__(self):
        self._lock = threading.Lock()
        self._pending: dict[int, float] = {}
        self._flushed_at = 0.0

    def record(self, agent_id: int) -> dict[int, float]:
        """Buffer the heartbeat; returns the batch the cache refused (empty when
        written or not yet due), for the caller to save elsewhere. A refused batch
        stays buffered, so it reaches the cache once it answers again."""
        now = time.time()
        with self._lock:
            self._pending[agent_id] = now
            if now - self._flushed_at < self.FLUSH_S:
                return {}
            batch, self._pending, self._flushed_at = self._pending, {}, now
        try:
            _cache().set_many({_seen_key(i): t for i, t in batch.items()}, timeout=HEARTBEAT_TTL)
        except Exception:
            logger.warning("cache unavailable; %d heartbeat(s) kept for the next flush",
                           len(batch), exc_info=True)
            with self._lock:
                for i, t in batch.items():
                    self._pending[i] = max(t, self._pending.get(i, t))
            return batch
        return {}

    def note(self, agent_id: int) -> bool:
        """Buffer the heartbeat when no flush is due (no I/O); False, and nothing
        buffered, when one is: the caller then records it through record()."""
        now = time.time()
        with self._lock:
            if now - self._flushed_at >= self.FLUSH_S:
                return False
            self._pending[agent_id] = now
            return True

    def pending(self) -> dict[int, float]:
        with self._lock:
            return dict(self._pending)


_heartbeats = _HeartbeatBuffer()


def record_heartbeat(agent_id: int) -> dict[int, float]:
    """Record a poll; returns the heartbeats (agent id -> unix time) the cache
    refused just now, which the caller saves to the database instead."""
    return _heartbeats.record(agent_id)


def heartbeat_noted(agent_id: int) -> bool:
    """Record a poll without any I/O; False (nothing recorded) when the buffer is
    due for its flush, which record_heartbeat() then does."""
    return _heartbeats.note(agent_id)


def heartbeats(agent_ids) -> dict[int, float]:
    """agent id -> unix time of its last poll, for those the cache (or this
    process's unflushed buffer) knows."""
    ids = list(agent_ids)
    if not ids:
        return {}
    try:
        found = _get_many([_seen_key(i) for i in ids])
    except Exception:
        logger.warning("cache unavailable; heartbeats unknown", exc_info=True)
        found = {}
    pending = _heartbeats.pending()
    seen = {}
    for i in ids:
        times = [t for t in (found.get(_seen_key(i)), pending.get(i)) if t is not None]
        if times:
            seen[i] = max(times)
    return seen


def async_redis():
    """(the Redis cache backend, agentapi's batched client: `_AsyncRedis`), for the
    agentapi's other reads and writes (agentapi.bundle); None when the cache is
    not Redis (local memory is used directly: no I/O)."""
    backend = _cache()
    if not isinstance(backend, RedisCache):
        return None
    return backend, _async_redis
