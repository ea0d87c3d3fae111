"""Stopping on SIGINT and SIGTERM (docs/agents.md, "Signals").

`install` makes either signal raise `Stopped` where the agent is — a command's
output being read, a poll held by the server, the sleep between polls — once. The
exception is a BaseException, so no `except Exception` on its way (an apply's,
the loop's) takes it for a failure: it unwinds to the entry point, which exits
128 + the signal's number (130, 143). Code that runs a command ends the command's
process group as the exception passes (agent/apply.py).

Inside `deferred()` (while a command is being started, before its pid is known)
a signal is only noted, and raised when the block ends.
"""

from __future__ import annotations

import contextlib
import logging
import signal

logger = logging.getLogger("agent")

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Stopped(BaseException):
    """SIGINT or SIGTERM arrived: the agent stops."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        self.announced = False
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def announce(self) -> None:
        """Log that the agent is stopping, once: where the exception is first caught
        (never in the signal handler, which may interrupt a log line being written)."""
        if not self.announced:
            self.announced = True
            logger.info("%s received: stopping", self.name)


class _Stopping:
    received: int | None = None  # the first signal
    raised = False
    deferring = 0


_stopping = _Stopping()


def _received(signum, frame) -> None:
    if _stopping.received is None:
        _stopping.received = signum
    if not _stopping.deferring:
        raise_if_stopping()


def raise_if_stopping() -> None:
    """Raise Stopped for a signal received and not raised yet (once in all)."""
    if _stopping.received is not None and not _stopping.raised:
        _stopping.raised = True
        raise Stopped(_stopping.received)


@contextlib.contextmanager
def deferred():
    """A signal arriving inside the block is raised when it ends (also when it ends
    with an exception: stopping wins)."""
    _stopping.deferring += 1
    try:
        yield
    finally:
        _stopping.deferring -= 1
        if not _stopping.deferring:
            raise_if_stopping()


def install():
    """Handle SIGINT and SIGTERM from now on; returns what puts the previous handlers
    back. A SIGINT this process was started with ignored (`cmd &` in a script) stays
    ignored, as Python leaves it."""
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    _stopping.received, _stopping.raised, _stopping.deferring = None, False, 0
    for signum in SIGNALS:
        if previous[signum] is not signal.SIG_IGN or signum == signal.SIGTERM:
            signal.signal(signum, _received)

    def restore() -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return restore
