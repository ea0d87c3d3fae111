"""Requests admitted into Django a few at a time per process, each on one of a
fixed set of threads.

Each request in Django holds a pooled database connection; with hundreds at once
(a publish) they would queue on the pool and answer 503. At most
BELLWETHER_DJANGO_CONCURRENCY (default: the pool's size) run at once; the others
wait on the event loop (a future each) and are answered 503 with Retry-After after
BELLWETHER_DJANGO_QUEUE_S. /healthz, /readyz and static files are never queued.
Each admitted request runs on a thread lent for it (asgiref's
ThreadSensitiveContext with an executor): Django's own thread per request leaves a
database wrapper per thread in reference cycles, megabytes at fleet scale.
"""

import asyncio
import contextlib
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.db import connection

from project.bodylimits import envelope, send_json

UNQUEUED_PREFIXES = ("/healthz", "/readyz", "/static/")
BUSY = envelope("unavailable", "The server is busy; try again shortly.")


class Busy(Exception):
    """No thread was lent within BELLWETHER_DJANGO_QUEUE_S: answer 503 (`busy`)."""


async def busy(send) -> None:
    await send_json(send, 503, BUSY, (b"retry-after", b"5"))


class Admission:
    """At most `settings.BELLWETHER_DJANGO_CONCURRENCY` requests at once per event
    loop on the database's side, each on a thread lent from as many."""

    def __init__(self):
        self._threads: dict[asyncio.AbstractEventLoop, asyncio.Queue] = {}

    def _idle_threads(self) -> asyncio.Queue:
        """The event loop's idle threads: single-thread executors, made on first use
        (after a server forks its workers). A new loop (a test's) gets its own; the
        previous loop's threads end as their executors are dropped."""
        loop = asyncio.get_running_loop()
        threads = self._threads.get(loop)
        if threads is None:
            threads = asyncio.Queue()
            for number in range(1, settings.BELLWETHER_DJANGO_CONCURRENCY + 1):
                threads.put_nowait(ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix=f"django-request-{number}"))
            self._threads = {loop: threads}
        return threads

    @contextlib.asynccontextmanager
    async def admitted(self):
        """Inside: the synchronous code (sync_to_async, Django's too) runs on the
        thread lent. Busy when none was lent in time."""
        threads = self._idle_threads()
        try:
            thread = await asyncio.wait_for(threads.get(), settings.BELLWETHER_DJANGO_QUEUE_S)
        except TimeoutError:
            raise Busy from None
        try:
            async with ThreadSensitiveContext(executor=thread):
                yield
        finally:
            threads.put_nowait(thread)

    async def run(self, function, *args):
        """`function(*args)` on a lent thread (Busy when none was lent in time), its
        database connection handed back to the pool after, as at the end of a
        request Django answers."""
        async with self.admitted():
            return await sync_to_async(connection_returned)(function, *args)


def connection_returned(function, *args):
    """`function(*args)`, this thread's database connection handed back to the pool
    after (but inside a transaction: a test's)."""
    try:
        return function(*args)
    finally:
        if not connection.in_atomic_block:  # (a test's transaction holds it)
            connection.close()


admission = Admission()


class DjangoAdmission:
    """ASGI middleware: HTTP requests enter the wrapped application (Django) through
    `admission`: a few at a time, each on a lent thread; 503 when none was lent in
    time."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(UNQUEUED_PREFIXES):
            return await self.app(scope, receive, send)
        try:
            async with admission.admitted():
                return await self.app(scope, receive, send)
        except Busy:
            return await busy(send)
