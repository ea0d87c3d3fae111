"""Which cached poll answers this process must not trust: the token keys of the
unsettled poll invalidations (PollInvalidation rows, written in each change's
transaction), read at most every POLL_DEBT_REFRESH_S.

An indebted key's cached answer is not used unless the change named the generation
each agent reached and the answer was computed at it or later (a refill,
apps.fleet.refill, or a later poll wrote it). So a stale answer outlives its change
by about one refresh interval whatever the cache did; in the steady state the 304
costs one query per process per interval. When the database fails, the last set
read is kept.
"""

import logging
import threading
import time

from django.db import DatabaseError
from django.utils import timezone

from apps.fleet import rules, selectors, services

logger = logging.getLogger(__name__)


class _Debts:
    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self._lock = threading.Lock()
        self._keys: frozenset[str] = frozenset()
        self._loaded = False
        self._due = 0.0

    def owes(self, token_key: str, generation: int | None = None) -> bool | None:
        """Whether this agent's cached poll answer, computed at `generation`, may be
        stale; None while the debts were never read (the database failing)."""
        if self.clock() >= self._due:
            self._refresh()
        return self._distrusts(token_key, generation) if self._loaded else None

    def owes_known(self, token_key: str, generation: int | None = None) -> bool | None:
        """owes() without touching the database: None when the debts are due for
        their refresh (or were never read), which a call of owes() then does."""
        if not self._loaded or self.clock() >= self._due:
            return None
        return self._distrusts(token_key, generation)

    def _distrusts(self, token_key: str, generation: int | None) -> bool:
        keys = self._keys
        if token_key not in keys:
            return False
        # Keys given as a plain set name no generation: no cached answer is trusted.
        generations = keys.generations if isinstance(keys, rules.IndebtedKeys) else {}
        return not rules.cached_answer_reflects(generations.get(token_key), generation)

    def _refresh(self) -> None:
        # The first read blocks (a new process knows nothing yet); later ones are
        # done by one thread while the others use the last set.
        if not self._lock.acquire(blocking=not self._loaded):
            return
        try:
            now = self.clock()
            if now < self._due:
                return
            self._due = now + rules.POLL_DEBT_REFRESH_S
            try:
                keys, seen = selectors.poll_debts()
            except DatabaseError:
                logger.warning("database unavailable; poll debts not refreshed (%d kept)",
                               len(self._keys), exc_info=True)
                return
            self._keys, self._loaded = keys, True
            if rules.poll_debts_need_sweep(seen, timezone.now()):
                _sweep()
        finally:
            self._lock.release()

    def refilled(self, token_key: str) -> bool:
        """Whether this key's debt names the generation its change reached: such a
        change refills the agent's answer and announces it (apps.fleet.refill);
        one without (a mode, labels, a revoke) only drops it."""
        keys = self._keys
        return isinstance(keys, rules.IndebtedKeys) and token_key in keys.generations

    def indebted(self) -> frozenset[str]:
        return self._keys


def _sweep() -> None:
    """Settle what is due from here too, so debts end without beat (every
    process may: settling twice is harmless)."""
    try:
        services.poll_invalidations_sweep()
    except DatabaseError:
        logger.warning("database unavailable; poll invalidations not swept", exc_info=True)


_debts = _Debts()


def owes(token_key: str, generation: int | None = None) -> bool | None:
    """Whether the token's cached answer, computed at `generation` (None: unknown),
    may be stale; None while the debts could never be read."""
    return _debts.owes(token_key, generation)


def owes_known(token_key: str, generation: int | None = None) -> bool | None:
    """Whether this agent's cached answer may be stale, from the debts last read;
    None when they are due for a refresh (only owes() reads the database)."""
    return _debts.owes_known(token_key, generation)


def refilled(token_key: str) -> bool:
    """Whether the change this key owes refills its answer (see _Debts.refilled)."""
    return _debts.refilled(token_key)
