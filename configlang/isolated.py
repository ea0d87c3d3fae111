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
0.1-0.4 s, so each process keeps one spare child started ahead: a render takes
the spare (its interpreter already up) and starts the next one. A spare holds
no work until it is given some, and exits when its parent's end of its stdin
closes; a forked process forgets its parent's spare.

The parent writes the pickled (render, source, seconds, memory_bytes) to the
child's stdin and reads the pickled Rendered from its stdout; `render` is a
module-level function, pickled by reference. The child first writes one byte,
READY, once its interpreter has started and imported what rendering needs: the
render's wall time (`seconds` + `grace`) counts from then, and the start has its
own allowance (STARTUP_SECONDS), so a busy machine's slow start (0.1 s idle,
seconds under load) is not charged to the template.
"""

import atexit
import os
import pickle
import resource
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from configlang.problems import Problem
from configlang.rendering import Rendered, render_source

GRACE_SECONDS = 5  # on top of the budget's own deadline, before the child is killed
STARTUP_SECONDS = 10  # for the child to start and import, before its render's time counts
READY = b"R"
# Where `configlang` (and the project) can be imported from in the child.
_ROOT = str(Path(__file__).resolve().parent.parent)

STOPPED = "the render took longer than {seconds:g} seconds and was stopped"
NOT_STARTED = "the render could not start within {seconds:g} seconds and was stopped"
OVER_LIMIT = "the render went over its memory or CPU limit and was stopped"


_spare_lock = threading.Lock()
_spare: subprocess.Popen | None = None


def _start_child() -> subprocess.Popen:
    """A fresh interpreter importing what rendering needs (OSError when none can start)."""
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _ROOT,
               "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "configlang.isolated"], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=environ, cwd=_ROOT,
        close_fds=True)


def _stop(child: subprocess.Popen) -> None:
    """Kill `child` if it still runs, close our ends of its pipes, reap it."""
    if child.poll() is None:
        child.kill()
    for stream in (child.stdin, child.stdout):
        if not stream.closed:
            stream.close()
    child.wait()


def _take_child() -> subprocess.Popen:
    """A child for one render: the spare if it is still alive, else a new one; then
    a new spare for the next render. OSError when no child can be started."""
    global _spare
    with _spare_lock:
        child, _spare = _spare, None
    if child is not None and child.poll() is not None:
        _stop(child)
        child = None
    if child is None:
        child = _start_child()
    try:
        spare = _start_child()
    except OSError:
        return child
    with _spare_lock:
        spare, _spare = _spare, spare
    if spare is not None:  # another thread's spare arrived first
        _stop(spare)
    return child


def discard_spare() -> None:
    """Stop this process's spare child (at exit; tests that change how children start)."""
    global _spare
    with _spare_lock:
        child, _spare = _spare, None
    if child is not None:
        _stop(child)


def _forget_spare_after_fork() -> None:
    """The forked process's spare is its parent's child: forget it, never use it."""
    global _spare, _spare_lock
    _spare_lock, _spare = threading.Lock(), None


atexit.register(discard_spare)
os.register_at_fork(after_in_child=_forget_spare_after_fork)


def _address_space() -> int:
    """This process's current virtual size in bytes (the child starts with it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _limited(reason: str, *, timed_out: bool = False) -> Rendered:
    """A render stopped by a limit of the child (memory, CPU, wall time): how far it
    got depends on the server's load too; `timed_out`: wall time alone."""
    return Rendered(effective_config={}, problems=[Problem("render_limit", reason)],
                    load_dependent=True, timed_out=timed_out)


def _child_main() -> None:
    """The child: read the work, limit itself, render, write the pickled result.
    A child that dies writes nothing, which the parent reports."""
    sys.stdout.buffer.write(READY)  # started and imported: the render's time counts now
    sys.stdout.buffer.flush()
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


def _exchange(child: subprocess.Popen, work: bytes, startup: float,
              seconds: float) -> bytes | bool:
    """Write `work`, read everything the child writes until it exits: the child
    has `startup` seconds to say READY, then `seconds` to finish. False when it
    did not start in time, True when it did not finish in time."""
    os.set_blocking(child.stdin.fileno(), False)
    os.set_blocking(child.stdout.fileno(), False)
    view, chunks = memoryview(work), []
    writing, reading = [child.stdin], [child.stdout]
    deadline, started = time.monotonic() + startup, False
    while reading:
        if not started and chunks and chunks[0]:
            deadline, started = time.monotonic() + seconds, True
        left = deadline - time.monotonic()
        if left <= 0:
            return started
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
                    grace: float = GRACE_SECONDS, startup: float = STARTUP_SECONDS,
                    render=render_source) -> Rendered:
    """render(source) in a child process with at most `memory_bytes` more address
    space than the child has once started, `seconds` of wall time (plus `grace`)
    from when it is ready (it has `startup` seconds to be) and as much CPU time; a
    child over a limit is a render_limit. `render` must
    be a module-level function (pickled by reference)."""
    work = pickle.dumps((render, source, seconds, memory_bytes),
                        protocol=pickle.HIGHEST_PROTOCOL)
    try:
        child = _take_child()
    except OSError:  # no child can be started: render here
        return render(source, seconds=seconds)
    data = True
    try:
        data = _exchange(child, work, startup, seconds + grace)
    finally:
        _stop(child)
    if data is False:
        return _limited(NOT_STARTED.format(seconds=startup), timed_out=True)
    if data is True:
        return _limited(STOPPED.format(seconds=seconds), timed_out=True)
    if not data.startswith(READY) or len(data) == 1 or child.returncode != 0:
        return _limited(OVER_LIMIT)
    result = pickle.loads(data[1:])  # noqa: S301 - our own child's answer
    if not isinstance(result, Rendered):
        return Rendered(effective_config={}, problems=[Problem(
            "render_failed", "internal error while rendering (no result)")])
    return result


if __name__ == "__main__":
    _child_main()
