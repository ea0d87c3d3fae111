"""The hard backstop behind the render budget: render in a child process
limited in address space (RLIMIT_AS) and CPU time (RLIMIT_CPU), killed when it
outlives its wall time. Whatever a template or a bug in a library does, the
parent gets a result — the render's, or one `render_limit` problem — and its
own memory is untouched.

The child is forked by multiprocessing's fork server, a single-threaded process
started once (by fork and exec) that has imported this module and nothing of
the caller's state: never by the serving process itself. A child forked from a
multi-threaded server inherits locks other threads held at the fork (SQLite's,
a stream's, a logging handler's), and Python finalizes the other threads'
thread-local objects (their database connections) in the child before any of
our code runs: such a child can block for ever, and a database connection
closed there can end the parent's session.
"""

import multiprocessing
import multiprocessing.spawn
import pickle
import resource
import time

from configlang.problems import Problem
from configlang.rendering import Rendered, render_source

GRACE_SECONDS = 5  # on top of the budget's own deadline, before the child is killed

CHILD_NAME = "bellwether-render"
_children = multiprocessing.get_context("forkserver")
_children.set_forkserver_preload(["configlang.isolated"])
_preparation_data = multiprocessing.spawn.get_preparation_data


def _without_main(name: str) -> dict:
    """multiprocessing has each child import the caller's main module (a server's
    command-line script: slow, and run again when it is not guarded); a render
    child needs only this module, which the fork server has imported."""
    data = _preparation_data(name)
    if name == CHILD_NAME:
        data.pop("init_main_from_path", None)
        data.pop("init_main_from_name", None)
    return data


multiprocessing.spawn.get_preparation_data = _without_main


def _address_space() -> int:
    """This process's current virtual size in bytes (the child starts with it)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def _child(writer, render, source: dict, seconds: float, memory_bytes: int) -> None:
    """Runs in the child: limits itself, renders, sends the pickled result. A child
    that dies sends nothing, which the parent reports."""
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
    writer.send_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))


def _limited(reason: str) -> Rendered:
    """A render stopped by a limit of the child (memory, CPU, wall time): how far it
    got depends on the server's load too."""
    return Rendered(effective_config={}, problems=[Problem("render_limit", reason)],
                    load_dependent=True)


def _receive(reader, deadline: float) -> bytes | None:
    """The child's answer; b"" when it ended without one, None at `deadline`."""
    if not reader.poll(max(0.0, deadline - time.monotonic())):
        return None
    try:
        return reader.recv_bytes()
    except (EOFError, OSError):
        return b""


STOPPED = "the render took longer than {seconds:g} seconds and was stopped"
OVER_LIMIT = "the render went over its memory or CPU limit and was stopped"


def render_isolated(source: dict, *, seconds: float, memory_bytes: int,
                    grace: float = GRACE_SECONDS, render=render_source) -> Rendered:
    """render(source) in a child process with at most `memory_bytes` more
    address space than the fork server, `seconds` of wall time (plus `grace`)
    and as much CPU time; a child over a limit is a render_limit. `render` is
    passed by reference (a module-level function)."""
    reader, writer = _children.Pipe(duplex=False)
    child = _children.Process(target=_child, name=CHILD_NAME, daemon=True,
                              args=(writer, render, source, seconds, memory_bytes))
    try:
        child.start()
    except OSError:  # no child can be started: render here
        reader.close()
        writer.close()
        return render(source, seconds=seconds)
    writer.close()
    data = None
    try:
        data = _receive(reader, time.monotonic() + seconds + grace)
    finally:
        reader.close()
        if data is None:
            child.kill()
        child.join()
        child.close()
    if data is None:
        return _limited(STOPPED.format(seconds=seconds))
    if not data:
        return _limited(OVER_LIMIT)
    result = pickle.loads(data)  # noqa: S301 - our own child's answer
    if not isinstance(result, Rendered):
        return Rendered(effective_config={}, problems=[Problem(
            "render_failed", "internal error while rendering (no result)")])
    return result
