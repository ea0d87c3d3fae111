"""The hard backstop behind the render budget: render in a forked child process
limited in address space (RLIMIT_AS) and CPU time (RLIMIT_CPU), killed when it
outlives its wall time. Whatever a template or a bug in a library does, the
parent gets a result — the render's, or one `render_limit` problem — and its
own memory is untouched.
"""

import os
import pickle
import resource
import select
import signal
import time

from configlang.problems import Problem
from configlang.rendering import Rendered, render_source

GRACE_SECONDS = 5  # on top of the budget's own deadline, before the child is killed


def _address_space() -> int:
    """This process's current virtual size in bytes (the child starts with it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _child(fd: int, source: dict, seconds: float, memory_bytes: int) -> None:
    """Runs in the forked child and never returns: no after-fork hook, atexit
    handler or finalizer of the parent's libraries runs here."""
    code = 0
    try:
        limit = _address_space() + memory_bytes
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(seconds) + GRACE_SECONDS
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        try:
            result = render_source(source, seconds=seconds)
        except MemoryError:
            result = _limited("the render ran out of memory")
        except Exception as exc:  # a bug, not the template's doing
            result = Rendered(effective_config={}, problems=[Problem(
                "render_failed", f"internal error while rendering ({type(exc).__name__})")])
        data = pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:  # noqa: BLE001 - the parent reports a child without an answer
        code = 1
    finally:
        os._exit(code)


def _limited(reason: str) -> Rendered:
    return Rendered(effective_config={}, problems=[Problem("render_limit", reason)])


def _read_all(fd: int, deadline: float) -> bytes | None:
    """Everything the child writes until it closes its end, or None at `deadline`."""
    chunks = []
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def render_isolated(source: dict, *, seconds: float, memory_bytes: int,
                    grace: float = GRACE_SECONDS) -> Rendered:
    """render_source(source) in a forked child with at most `memory_bytes` more
    address space than this process, `seconds` of wall time (plus `grace`)
    and as much CPU time; a child over a limit is a render_limit."""
    reader, writer = os.pipe()
    try:
        pid = os.fork()
    except OSError:  # no child can be started: render here
        os.close(reader)
        os.close(writer)
        return render_source(source, seconds=seconds)
    if pid == 0:
        os.close(reader)
        _child(writer, source, seconds, memory_bytes)
    os.close(writer)
    data = None
    try:
        data = _read_all(reader, time.monotonic() + seconds + grace)
    finally:
        os.close(reader)
        if data is None:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    if data is None:
        return _limited(f"the render took longer than {seconds:g} seconds and was stopped")
    if not data:
        return _limited("the render went over its memory or CPU limit and was stopped")
    result = pickle.loads(data)  # noqa: S301 - our own child's answer
    if not isinstance(result, Rendered):
        return Rendered(effective_config={}, problems=[Problem(
            "render_failed", "internal error while rendering (no result)")])
    return result
