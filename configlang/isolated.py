"""The hard backstop behind the render budget: render in a forked child process
limited in address space (RLIMIT_AS) and CPU time (RLIMIT_CPU), killed when it
outlives its wall time. Whatever a template or a bug in a library does, the
parent gets a result — the render's, or one `render_limit` problem — and its
own memory is untouched.
"""

import multiprocessing
import resource

from configlang.problems import Problem
from configlang.rendering import Rendered, render_source

GRACE_SECONDS = 5  # on top of the budget's own deadline, before the child is killed


def _address_space() -> int:
    """This process's current virtual size in bytes (the child starts with it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _child(connection, source: dict, seconds: float, memory_bytes: int) -> None:
    limit = _address_space() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = int(seconds) + GRACE_SECONDS
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    try:
        result = render_source(source, seconds=seconds)
    except MemoryError:
        result = _limited("the render ran out of memory")
    connection.send(result)
    connection.close()


def _limited(reason: str) -> Rendered:
    return Rendered(effective_config={}, problems=[Problem("render_limit", reason)])


def render_isolated(source: dict, *, seconds: float, memory_bytes: int) -> Rendered:
    """render_source(source) in a child process with at most `memory_bytes` more
    address space than this one, `seconds` of wall time (plus a grace period)."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(sender, source, seconds, memory_bytes),
                            daemon=True)
    try:
        child.start()
    except (AssertionError, OSError):  # e.g. a daemonic process may not fork: render here
        receiver.close()
        sender.close()
        return render_source(source, seconds=seconds)
    sender.close()
    try:
        if receiver.poll(seconds + GRACE_SECONDS):
            return receiver.recv()
        return _limited(f"the render took longer than {seconds:g} seconds and was stopped")
    except EOFError:  # the child died without an answer: killed by a limit
        return _limited("the render went over its memory or CPU limit and was stopped")
    finally:
        receiver.close()
        if child.is_alive():
            child.kill()
        child.join(1)
