"""The refill of poll answers after a change of many agents' desired state
(activations, pushes, pins): computed from the database and written to the cache
REFILL_CHUNK at a time, each chunk's long-polls then woken, so a publish does not
send every agent to the database at once.

It runs after the commit on one thread per process (embedded mode: in the
committing request), merging the prompts that arrive meanwhile. Nothing depends on
it for correctness: until it writes an answer, the change's poll debt distrusts
the old one (apps.fleet.polldebt).
"""

import logging
import threading
import time

from django.db import DatabaseError, connections

from apps.core.dispatch import tasks_inline
from apps.fleet import announcements, cache, selectors

logger = logging.getLogger(__name__)

# Written and announced this many answers at a time: the first agents hear of a
# change while the answers of the last are still being computed.
REFILL_CHUNK = 1000


def refill_and_announce(keys) -> None:
    """Compute and store the poll answers of these token keys (sorted), a chunk at
    a time, each chunk's long-polls woken once it is stored; a token revoked
    meanwhile has its entry dropped. When the database fails, a chunk's entries
    are dropped instead (those agents are answered by Django)."""
    started, first = time.monotonic(), None
    for start in range(0, len(keys), REFILL_CHUNK):
        chunk = keys[start:start + REFILL_CHUNK]
        try:
            states = selectors.poll_states_of(chunk)
        except DatabaseError:
            logger.warning("database unavailable; poll states dropped, not refilled",
                           exc_info=True)
            states = {}
        gone = [k for k in chunk if k not in states]
        if cache.store_poll_states(states) and cache.forget_poll_states(gone):
            announcements.announce(chunk)
            first = time.monotonic() - started if first is None else first
    logger.log(logging.INFO if len(keys) >= REFILL_CHUNK else logging.DEBUG,
               "refilled %d poll answers in %.2f s (%s)", len(keys),
               time.monotonic() - started, "none announced: the cache failed" if first is None
               else f"the first {min(len(keys), REFILL_CHUNK)} announced at {first:.2f} s")


class _Refiller:
    """The process's refill thread and the token keys waiting for it."""

    def __init__(self):
        self._condition = threading.Condition()
        self._waiting: set[str] = set()
        self._busy = False
        self._thread: threading.Thread | None = None

    def add(self, keys) -> None:
        with self._condition:
            self._waiting.update(keys)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="bellwether-refill",
                                                daemon=True)
                self._thread.start()
            self._condition.notify_all()

    def _take(self) -> list[str]:
        with self._condition:
            self._busy = False
            self._condition.notify_all()
            self._condition.wait_for(lambda: self._waiting)
            keys, self._waiting, self._busy = sorted(self._waiting), set(), True
            return keys

    def _run(self) -> None:
        while True:
            keys = self._take()
            try:
                refill_and_announce(keys)
            except Exception:  # a bug in one run must not stop the thread
                logger.exception("refilling %d poll answers failed", len(keys))
            finally:
                connections.close_all()  # this thread's: a restarted database is no matter

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._condition:
            return self._condition.wait_for(lambda: not self._waiting and not self._busy,
                                            timeout)


_refiller = _Refiller()


def refill_after_commit(keys) -> None:
    """Refill these token keys' poll answers (the transaction has committed): on
    the process's refill thread, or here when tasks run inline."""
    if tasks_inline():
        refill_and_announce(keys)
    else:
        _refiller.add(keys)


def wait_until_refilled(timeout: float | None = None) -> bool:
    """Block until the refill thread has nothing left (benchmarks, tests)."""
    return _refiller.wait_idle(timeout)
