"""Announcements: which agents' desired state changed, told to every web node.

Token keys are published on Redis (`channel()`) once their change commits, so
every node's long-polls hear them (agentapi.longpoll); in embedded mode they go to
this process's listeners. Best effort: a poll not woken ends its wait, and the
poll sweep announces again what it settles.
"""

import logging
from collections.abc import Callable

import redis
from django.conf import settings
from django.core.cache.backends.redis import RedisCache

from apps.fleet import cache

logger = logging.getLogger(__name__)

# This process's listeners (embedded mode: no Redis to publish on).
_listeners: list[Callable[[list[str]], None]] = []


def channel() -> str:
    prefix = settings.CACHES["default"].get("KEY_PREFIX", "")
    return f"{prefix}:fleet:wake" if prefix else "fleet:wake"


def listen(callback: Callable[[list[str]], None]) -> None:
    """Call `callback(token_keys)` on each announcement made in this process (embedded
    mode; with Redis, listeners subscribe to `channel()` instead)."""
    if callback not in _listeners:
        _listeners.append(callback)


class _Publisher:
    """The synchronous Redis client announcements go out through (one per process)."""

    def __init__(self):
        self._client = None
        self._url = None

    def publish(self, url: str, message: str) -> None:
        if self._client is None or self._url != url:
            self._client = redis.Redis.from_url(
                url, socket_timeout=settings.REDIS_TIMEOUT_S,
                socket_connect_timeout=settings.REDIS_TIMEOUT_S)
            self._url = url
        self._client.publish(channel(), message)


_publisher = _Publisher()


def announce(token_keys) -> None:
    """Tell every web node that these agents' desired state changed (called on
    commit)."""
    keys = sorted(set(token_keys))
    if not keys:
        return
    backend = cache._cache()
    if not isinstance(backend, RedisCache):
        for callback in _listeners:
            callback(keys)
        return
    try:
        _publisher.publish(backend._servers[0], " ".join(keys))
    except Exception:
        logger.warning("Redis unavailable; %d long-poll(s) not woken", len(keys),
                       exc_info=True)
