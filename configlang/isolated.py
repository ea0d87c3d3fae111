"""The hard backstop behind the render budget: render in a child process
limited in address space (RLIMIT_AS) and CPU time (RLIMIT_CPU), killed when it
outlives its wall time. Whatever a template or a bug in a library does, the
parent gets a result — the render's, or one `render_limit` problem — and its
own memory is untouched.

The child is a fresh interpreter (fork and exec, `python -m configlang.isolated`)
that imports only what rendering needs: never a fork of the serving process. A
child forked from a multi-threaded server inherits locks other threads held at
the fork (SQLite's, a stream's, a logging handler's), and Python finalizes the
other threads' thread-local objects (their database connections) in the child
before any of our code runs: such a child can block for ever, and a database
connection closed there can end the parent's session. multiprocessing is no
way out either: Celery's pool processes are daemonic (refused children) and
carry an authentication key multiprocessing cannot pickle. Starting costs
about 0.1 s.

The parent writes the pickled (render, source, seconds, memory_bytes) to the
child's stdin and reads the pickled Rendered from its stdout; `render` is a
module-level function, pickled by reference.
"""

import os
import pickle
import resource
import select
import subprocess
import sys
import time
from pathlib import Path

from configlang.problems import Problem
from configlang.rendering import Rendered, render_source

GRACE_SECONDS = 5  # on top of the budget's own deadline, before the child is killed
# Where `configlang` (and the project) can be imported from in the child.
_ROOT = str(Path(__file__).resolve().parent.parent)

STOPPED = "the render took longer than {seconds:g} seconds and was stopped"
OVER_LIMIT = "the render went over its memory or CPU limit and was stopped"


def _address_space() -> int:
    """This process's current virtual size in bytes (the child starts with it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _limited(reason: str) -> Rendered:
    """A render stopped by a limit of the child (memory, CPU, wall time): how far it
    got depends on the server's load too."""
    return Rendered(effective_config={}, problems=[Problem("render_limit", reason)],
                    load_dependent=True)


def _child_main() -> None:
    """The child: read the work, limit itself, render, write the pickled result.
    A child that dies writes nothing, which the parent reports."""
    render, source, seconds, memory_bytes = pickle.load(sys.stdin.buffer)
    limit = _address_space() + memory_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    cpu = int(seconds) + GRACE_SECONDS
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    try:
        result = render(source, seconds=seconds)
    except MemoryError:
        result = _limited("the render ran out of memory")
    except Exception as exc:  # a bug, not the template's doing
        result = Rendered(effective_config={}, problems=[Problem(
            "render_failed", f"internal error while rendering ({type(exc).__name__})")])
    sys.stdout.buffer.write(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()


def _exchange(child: subprocess.Popen, work: bytes, deadline: float) -> bytes | None:
    """Write `work`, read everything the child writes until it exits; None at
    `deadline`."""
    os.set_blocking(child.stdin.fileno(), False)
    os.set_blocking(child.stdout.fileno(), False)
    view, chunks = memoryview(work), []
    writing, reading = [child.stdin], [child.stdout]
    while reading:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        readable, writable, _ = select.select(reading, writing, [], left)
        if writable:
            try:
                view = view[os.write(child.stdin.fileno(), view):]
            except BrokenPipeError:  # the child died before reading it all
                view = view[len(view):]
            if not view:
                child.stdin.close()
                writing = []
        if readable:
            chunk = os.read(child.stdout.fileno(), 1 << 20)
            if not chunk:
                reading = []
            chunks.append(chunk)
    return b"".join(chunks)


def render_isolated(source: dict, *, seconds: float, memory_bytes: int,
                    grace: float = GRACE_SECONDS, render=render_source) -> Rendered:
    """render(source) in a child process with at most `memory_bytes` more address
    space than the child has once started, `seconds` of wall time (plus `grace`)
    and as much CPU time; a child over a limit is a render_limit. `render` must
    be a module-level function (pickled by reference)."""
    work = pickle.dumps((render, source, seconds, memory_bytes),
                        protocol=pickle.HIGHEST_PROTOCOL)
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _ROOT,
               "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "configlang.isolated"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environ, cwd=_ROOT,
            close_fds=True)
    except OSError:  # no child can be started: render here
        return render(source, seconds=seconds)
    data = None
    try:
        data = _exchange(child, work, time.monotonic() + seconds + grace)
    finally:
        if data is None:
            child.kill()
        for stream in (child.stdin, child.stdout):
            if not stream.closed:
                stream.close()
        child.wait()
    if data is None:
        return _limited(STOPPED.format(seconds=seconds))
    if not data or child.returncode != 0:
        return _limited(OVER_LIMIT)
    result = pickle.loads(data)  # noqa: S301 - our own child's answer
    if not isinstance(result, Rendered):
        return Rendered(effective_config={}, problems=[Problem(
            "render_failed", "internal error while rendering (no result)")])
    return result


if __name__ == "__main__":
    _child_main()
