"""The cyclic garbage collector of a serving process, tuned for a large live heap,
and the C allocator's arenas bounded.

A web process holding ten thousand long-polls keeps millions of objects alive
(each held request's scope, headers, coroutines and futures), and CPython's
default thresholds (700, 10, 10) then run a full collection, which walks every
one of them, every few thousand requests: measured at 10,000 agents, each web
worker spent 3.1 s of the 15 s after a publish in the collector (8 full
collections), half of the web tier's CPU. Reference counting frees nearly all
of a request's objects; the collector is only for cycles, which are rare here.

`install()` (project/asgi.py for the web processes, project/celery.py for each
worker process) freezes what the process built while starting (Django, the URL
conf, the models: never garbage, never walked again) and collects far less
often: a young collection every YOUNG_THRESHOLD new container objects, a full
one after FULL_AFTER middle ones (and, as always, only when the objects that
survived since the last one are a quarter of the old generation).

It also bounds glibc's malloc to MALLOC_ARENAS arenas (unless the environment sets
MALLOC_ARENA_MAX). glibc gives each thread that allocates an arena of its own, up
to eight a core, and an arena's freed blocks serve only its threads: a web process
runs Django on a dozen threads beside the event loop that holds the long-polls,
and the memory each thread freed stayed with it. Measured at 4,000 agents on the
agent node: 10.1 → 8.6 KiB per more waiting agent (docs/benchmarks.md).
"""

import ctypes
import gc
import os

YOUNG_THRESHOLD = 50_000
MIDDLE_AFTER = 20
FULL_AFTER = 100
MALLOC_ARENAS = 2
_M_ARENA_MAX = -8  # glibc's mallopt() parameter


def install() -> None:
    gc.collect()  # what starting up left as garbage is not frozen with the rest
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_AFTER, FULL_AFTER)
    malloc_arenas_bounded()


def malloc_arenas_bounded() -> bool:
    """At most MALLOC_ARENAS malloc arenas from now on (threads started later share
    them); False where the C library is not glibc or the environment decides."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False  # read by glibc itself as the process started
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    return bool(mallopt and mallopt(_M_ARENA_MAX, MALLOC_ARENAS) == 1)
