"""The cyclic garbage collector of a serving process, tuned for a large live heap.

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
"""

import gc

YOUNG_THRESHOLD = 50_000
MIDDLE_AFTER = 20
FULL_AFTER = 100


def install() -> None:
    gc.collect()  # what starting up left as garbage is not frozen with the rest
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_AFTER, FULL_AFTER)
