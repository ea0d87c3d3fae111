"""Skipping a best-effort dependency call for a moment after it failed.

A stalled Redis costs each call its timeout (REDIS_TIMEOUT_S). For calls whose
loss is harmless — a throttle that lets the request through, a live event the
page's polling covers — paying that timeout on every request of a stall would
add up to several seconds per request. A `Breaker` remembers a failure for
`pause_s` seconds, during which those calls are skipped at once; the first call
after the pause tries again.
"""

import logging
import threading
import time

logger = logging.getLogger(__name__)


class Breaker:
    def __init__(self, name: str, *, pause_s: float = 5.0, clock=time.monotonic):
        self.name, self.pause_s, self.clock = name, pause_s, clock
        self._lock = threading.Lock()
        self._until = 0.0

    def allows(self) -> bool:
        """Whether to try the dependency now (no failure within the pause)."""
        return self.clock() >= self._until

    def failed(self, exc: BaseException) -> None:
        with self._lock:
            skipping = self.allows()
            self._until = self.clock() + self.pause_s
        if skipping:
            logger.warning("%s unavailable (%s); skipping it for %.0f s",
                           self.name, exc, self.pause_s)

    def reset(self) -> None:
        with self._lock:
            self._until = 0.0


# Redis calls whose loss is harmless: throttle counts and live events.
best_effort_redis = Breaker("redis (throttles, live events)")
