"""Long-polling: a poll held until its agent's desired state may have changed.

A change announces the token keys it concerns on commit (apps.fleet.announcements,
on Redis so every node hears it); each process holds its polls as futures by token
key and wakes those announced, and the poll decides again (agentapi.cached). When
the listener loses Redis it wakes every poll (an announcement may have been
missed). Held polls' heartbeats are recorded every HEARTBEAT_S.
"""

import asyncio
import logging
import math
import threading

import redis.asyncio
from django.conf import settings
from django.core.cache.backends.redis import RedisCache

from apps.fleet import announcements, cache

logger = logging.getLogger(__name__)

RECONNECT_S = 1.0
HEARTBEAT_S = 5.0


class _Waiters:
    """The polls this process holds, by token key, on one event loop.

    A held poll costs a future under its token key (woken by an announcement) and
    the event loop's timer that ends its wait."""

    def __init__(self):
        self._loop: asyncio.AbstractEventLoop | None = None
        self._by_key: dict[str, dict[asyncio.Future, int]] = {}
        self._listener: asyncio.Task | None = None
        self._lock = threading.Lock()
        self._heard_at = -math.inf  # when the last announcement arrived (loop time)

    def _adopt(self, loop) -> None:
        if self._loop is not loop:  # a new loop (tests): nothing of the old one survives
            self._loop, self._by_key, self._listener = loop, {}, None
            self._heard_at = -math.inf
        if self._listener is None or self._listener.done():
            self._listener = loop.create_task(self._background())

    def wait(self, token_key: str, agent_id: int, seconds: float) -> asyncio.Future:
        """A future that is True once `token_key` is announced, False `seconds`
        later. Cancelling it (the client left) is cleaned up when its time is up."""
        loop = asyncio.get_running_loop()
        with self._lock:
            self._adopt(loop)
            woken = loop.create_future()
            self._by_key.setdefault(token_key, {})[woken] = agent_id
        loop.call_later(seconds, self._end, token_key, woken)
        return woken

    def _end(self, token_key: str, woken: asyncio.Future) -> None:
        """On the loop: the wait's time is up (False), unless it ended before."""
        with self._lock:
            waiting = self._by_key.get(token_key)
            if waiting is not None and waiting.pop(woken, None) is not None and not waiting:
                del self._by_key[token_key]
        if not woken.done():
            woken.set_result(False)

    def heard_at(self) -> float:
        loop = asyncio.get_running_loop()
        return self._heard_at if self._loop is loop else -math.inf

    def count(self) -> int:
        return sum(len(w) for w in self._by_key.values())

    def wake(self, token_keys) -> None:
        """On the loop: wake the polls of these keys (None: every poll)."""
        with self._lock:
            self._heard_at = self._loop.time()
            keys = list(self._by_key) if token_keys is None else token_keys
            for key in keys:
                for woken in self._by_key.pop(key, {}):
                    if not woken.done():
                        woken.set_result(True)

    def wake_threadsafe(self, token_keys) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self.wake, list(token_keys))

    def waiting_agents(self) -> set[int]:
        with self._lock:
            return {a for waiting in self._by_key.values() for a in waiting.values()}

    async def _background(self) -> None:
        loop = asyncio.get_running_loop()
        beats = loop.create_task(self._heartbeats())
        try:
            backend = cache._cache()
            if isinstance(backend, RedisCache):
                await self._listen(backend._servers[0])
            else:
                await asyncio.Event().wait()  # embedded: woken in-process only
        finally:
            beats.cancel()

    async def _listen(self, url: str) -> None:
        while True:
            try:
                client = redis.asyncio.Redis.from_url(
                    url, socket_connect_timeout=settings.REDIS_TIMEOUT_S,
                    health_check_interval=30)
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(announcements.channel())
                    self.wake(None)  # anything announced before now was missed
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            self.wake(message["data"].decode("ascii", "replace").split())
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.warning("Redis unavailable; long-polls woken to check again",
                               exc_info=True)
                self.wake(None)
            await asyncio.sleep(RECONNECT_S)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            agents = self.waiting_agents()
            # Written by a thread (one per process, every HEARTBEAT_S): the batch
            # write is the cache's synchronous client. A batch it refuses stays
            # buffered; while the cache fails the waiters are woken and their
            # polls are answered from the database, which saves their heartbeats.
            if agents:
                await asyncio.to_thread(_record_heartbeats, agents)


def _record_heartbeats(agent_ids) -> None:
    """A held poll's agent is seen."""
    for agent_id in agent_ids:
        cache.record_heartbeat(agent_id)


_waiters = _Waiters()


def wait_for_change(token_key: str, agent_id: int, seconds: float) -> asyncio.Future:
    """To await: hold a poll until its agent's desired state may have changed
    (True) or `seconds` pass (False). Costs a future and a timer, no thread and no
    query."""
    return _waiters.wait(token_key, agent_id, seconds)


def heard_at() -> float:
    """When (the running loop's time) this process last heard an announcement, of
    any agents; -inf if never. A refill announces its chunks as it writes them:
    while announcements keep coming, a refill is under way."""
    return _waiters.heard_at()


# Announcements made in this process (embedded mode) wake its polls.
announcements.listen(_waiters.wake_threadsafe)
