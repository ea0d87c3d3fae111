"""Requests admitted into Django a few at a time per web process, the rest queued on
the event loop.

Django's ASGI handler runs each request in a thread of its own and each holds a
pooled database connection while it runs; with hundreds of requests at once (a
fleet's first sync, every agent fetching and reporting after a publish) the
threads queue on the pool, and those waiting past DATABASE_POOL_TIMEOUT_S answer
503. `DjangoAdmission` lets at most BELLWETHER_DJANGO_CONCURRENCY (default: the
pool's size) HTTP requests into Django at once per process; the others wait in
order on the event loop (a future each, no thread, no connection) and are answered
503 `unavailable` with Retry-After only after BELLWETHER_DJANGO_QUEUE_S seconds
in the queue. Liveness (/healthz) and static files are never queued. Websockets
and the poll's 304 (answered in front, apps.fleet.edge) do not pass here.
"""

import asyncio
import json

from django.conf import settings

UNQUEUED_PREFIXES = ("/healthz", "/static/")
BUSY = json.dumps({"error": {"code": "unavailable",
                             "message": "The server is busy; try again shortly."}}).encode()


async def _busy(send) -> None:
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"retry-after", b"5"),
        (b"content-length", str(len(BUSY)).encode())]})
    await send({"type": "http.response.body", "body": BUSY})


class DjangoAdmission:
    """ASGI middleware: at most `settings.BELLWETHER_DJANGO_CONCURRENCY` HTTP requests
    inside the wrapped application at once, per event loop."""

    def __init__(self, app):
        self.app = app
        self._gates: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}

    def _gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()
        gate = self._gates.get(loop)
        if gate is None:
            self._gates = {loop: asyncio.Semaphore(settings.BELLWETHER_DJANGO_CONCURRENCY)}
            gate = self._gates[loop]
        return gate

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"].startswith(UNQUEUED_PREFIXES):
            return await self.app(scope, receive, send)
        gate = self._gate()
        try:
            await asyncio.wait_for(gate.acquire(), settings.BELLWETHER_DJANGO_QUEUE_S)
        except TimeoutError:
            return await _busy(send)
        try:
            return await self.app(scope, receive, send)
        finally:
            gate.release()
