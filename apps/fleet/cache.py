"""What the agent poll path keeps in the cache: per token, the agent's current ETag;
per agent, its last heartbeat. The database stays the source of truth: a miss or
an outage of the cache falls back to it, and cache errors never fail a request."""

import logging
import threading
import time

from django.core.cache import caches
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

# A poll state's lifetime. It does not bound a stale answer: a change's
# PollInvalidation row does (apps.fleet.polldebt).
POLL_STATE_TTL = 300
HEARTBEAT_TTL = 24 * 3600


def _poll_key(token_key: str) -> str:
    return f"fleet:poll:{token_key}"


def _seen_key(agent_id: int) -> str:
    return f"fleet:seen:{agent_id}"


def poll_state(token_key: str) -> dict | None:
    try:
        return _cache().get(_poll_key(token_key))
    except Exception:
        logger.warning("cache unavailable; answering polls from the database", exc_info=True)
        return None


def store_poll_state(*, token_key: str, token_hash: str, agent_id: int, etag: str) -> None:
    state = {"agent_id": agent_id, "token_hash": token_hash, "etag": etag}
    try:
        _cache().set(_poll_key(token_key), state, timeout=POLL_STATE_TTL)
    except Exception:
        logger.warning("cache unavailable; poll state not stored", exc_info=True)


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


class _HeartbeatBuffer:
    """Heartbeats of this process, written to the cache in one batch at most every
    FLUSH_S seconds: a poll then costs one cache read, not a read and a write."""

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
            return {}
        except Exception:
            logger.warning("cache unavailable; %d heartbeat(s) kept for the next flush",
                           len(batch), exc_info=True)
        with self._lock:
            for i, t in batch.items():
                self._pending[i] = max(t, self._pending.get(i, t))
        return batch

    def pending(self) -> dict[int, float]:
        with self._lock:
            return dict(self._pending)


_heartbeats = _HeartbeatBuffer()


def record_heartbeat(agent_id: int) -> dict[int, float]:
    """Record a poll; returns the heartbeats (agent id -> unix time) the cache
    refused just now, which the caller saves to the database instead."""
    return _heartbeats.record(agent_id)


def heartbeats(agent_ids) -> dict[int, float]:
    """agent id -> unix time of its last poll, for those the cache (or this
    process's unflushed buffer) knows."""
    ids = list(agent_ids)
    if not ids:
        return {}
    try:
        found = _cache().get_many([_seen_key(i) for i in ids])
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
