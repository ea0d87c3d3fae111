"""The agent node's server: HTTP/1.1 for the agents' API, a held long-poll in ~5 KB.

A held long-poll is an open connection and a request in flight. Under granian it
costs about 11 KB of the server's own (a connection's buffers and task, its
scope) before Bellwether's first byte, whatever its options, and about 13 KB all
told; this server holds one in about 5 KB (docs/benchmarks.md, "Memory per held
long-poll"): a uvloop transport, no parser while the request waits (llhttp
through httptools while one arrives), the ASGI scope and the application's task.
It serves `project.asgi`'s HTTP application — the edges answer the poll, the
bundles and the reports on the event loop, Django what they leave to it — and is
meant for the agents' pool (docs/operations.md: a load balancer routes
`/api/v1/agent/` to these nodes, everything else to granian's), so it speaks only
what agents need: HTTP/1.1 and 1.0, keep-alive, no websockets, no HTTP/2, no
lifespan.

    python -m project.pollnode --host 0.0.0.0 --port 8001 --workers <cores>

Bounds, for whatever a client sends: a request head of at most HEAD_MAX_BYTES and
HEADERS_MAX headers (else 431), a body within the application's limit
(project/bodylimits.py, BELLWETHER_MAX_REQUEST_BYTES: else 413), malformed HTTP
(an HTTP/1.1 request without Host too) 400, an HTTP version but 1.1 and 1.0 505,
more than PIPELINED_MAX requests (or PIPELINED_BODY_BYTES of bodies) sent ahead of
an answer 400 — each answered with the API's error envelope (unless an answer is
under way) and the connection closed; trailer fields are dropped (never request
headers). A request not complete HEAD_TIMEOUT_S after its first byte, a connection
idle KEEP_ALIVE_S between requests (empty lines are idle), or one not reading its
answer for SEND_TIMEOUT_S is dropped. An upgrade is answered as plain HTTP, then
the connection closed; nothing sent after a request that ends its connection
(`Connection: close`) is read. A client that leaves mid-request has its request's
task cancelled (a held poll stops waiting at once), or, when the application
listens for it (Django), is told with `http.disconnect`; what it sent of its
request is freed at once. Pipelined requests are answered in order, one at a time.
"""

import argparse
import asyncio
import collections
import contextlib
import logging
import os
import signal
import socket
import sys
import time
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import unquote

import httptools

from project.bodylimits import envelope

logger = logging.getLogger("bellwether.pollnode")

HEAD_MAX_BYTES = 16 * 1024
HEADERS_MAX = 100
BODY_MAX_BYTES = 10 * 1024 * 1024  # the worker serves with the application's own limit
HEAD_TIMEOUT_S = 10.0
KEEP_ALIVE_S = 120.0  # idle between requests (a held poll is a request: not idle)
SEND_TIMEOUT_S = 30.0  # a client not reading what it is sent for this long is dropped
SWEEP_S = 1.0  # how often the timeouts above are checked
PIPELINED_MAX = 8  # requests read ahead of the one being answered (more: refused)
PIPELINED_BODY_BYTES = 64 * 1024  # their bodies, all together
RESPAWN_S = 1.0  # a worker that died is started again, at most once a second

_REASONS = {status.value: status.phrase.encode() for status in HTTPStatus} | {
    413: b"Content Too Large"}  # (RFC 9110's name; Python 3.11 has the old one)
# A response without a body by its status or method (RFC 9112 6.3).
_NO_BODY = frozenset({204, 304})


class _Date:
    """The Date header's value, formatted once a second."""

    second, value = -1, b""

    @classmethod
    def now(cls) -> bytes:
        second = int(time.time())
        if second != cls.second:
            cls.second, cls.value = second, formatdate(second, usegmt=True).encode()
        return cls.value


_ASGI = {"version": "3.0", "spec_version": "2.3"}  # shared: the application only reads it

# Header fields repeat from request to request (every agent sends the same Host,
# User-Agent and Accept, most the same If-None-Match): requests share one copy of
# each of these, name lowered, instead of holding their own through a long-poll.
# Only fields that carry no credential are shared (never Authorization, Cookie,
# a CSRF token); the table is emptied when full (junk only costs the sharing).
_SHARED_FIELDS = frozenset({b"host", b"user-agent", b"accept", b"accept-encoding",
                            b"if-none-match", b"content-type", b"connection"})
_FIELDS: dict[tuple[bytes, bytes], tuple[bytes, bytes]] = {}
_FIELDS_MAX = 1024


def _field(name: bytes, value: bytes) -> tuple[bytes, bytes]:
    """(lower-case name, value), shared with earlier requests that sent the same."""
    field = _FIELDS.get((name, value))
    if field is None:
        field = (name.lower(), value)
        if field[0] in _SHARED_FIELDS:
            if len(_FIELDS) >= _FIELDS_MAX:
                _FIELDS.clear()
            _FIELDS[(name, value)] = field
    return field


class Connection(asyncio.Protocol):
    """One client connection: parses requests (httptools; a parser only while a
    request's bytes are arriving, none while a poll is held), runs the application
    for each in turn."""

    __slots__ = ("server", "transport", "parser", "url", "headers", "head_bytes", "body",
                 "in_body", "queue", "queued_bytes", "task", "request", "deadline", "writable",
                 "ended")

    def __init__(self, server: "PollNode"):
        self.server = server
        self.transport = self.parser = self.url = self.headers = self.body = None
        self.head_bytes = self.queued_bytes = 0
        self.in_body = self.ended = False
        self.queue: collections.deque | None = None
        self.task: asyncio.Task | None = None
        self.request: _Request | None = None
        self.deadline = 0.0
        self.writable: asyncio.Future | None = None

    # asyncio.Protocol
    def connection_made(self, transport):
        self.transport = transport
        self.deadline = self.server.now + self.server.keep_alive
        self.server.connections.add(self)

    def connection_lost(self, exc):
        self.server.connections.discard(self)
        # The parser and the connection hold each other: a request cut off mid-body
        # would keep its bytes (up to the body limit) until a collection ran.
        self.queue = self.parser = self.url = self.headers = self.body = None
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        if self.request is None or self.task is None or self.task.done():
            return
        if self.request.disconnected is not None:  # the application listens (Django)
            self.request.disconnect()
        else:  # it does not (a held poll): it stops waiting now
            self.task.cancel()

    def data_received(self, data):
        if self.ended:  # after a request that ends the connection: read, never parsed,
            return  # so that the client leaving is still seen
        if self.parser is None:
            self.parser = httptools.HttpRequestParser(self)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # not spoken here: answered as HTTP, then closed
            last = self.queue[-1] if self.queue else self.request
            if last is None:
                self._refuse(400, "invalid", "Upgrade is not spoken here.")
            else:
                last.keep_alive = False
                self.transport.pause_reading()
        except httptools.HttpParserError as error:  # a callback's raise is its context
            self._parse_failed(error.__context__)  # (not kept here: its frames hold self)
        else:
            if self.url is None:  # between requests: the parser has no state to keep
                self.parser = None

    def pause_writing(self):
        self.writable = self.server.loop.create_future()
        self.deadline = self.server.now + self.server.send_timeout  # the client must read

    def resume_writing(self):
        if self.writable is not None and not self.writable.done():
            self.writable.set_result(None)
        self.writable = None
        if self.task is not None:
            self.deadline = float("inf")  # an answer is under way

    # httptools callbacks
    def on_message_begin(self):
        self.url, self.headers, self.head_bytes, self.body = b"", [], 0, None
        self.in_body = False
        if self.task is None:  # (pipelined behind an answer: the answer's deadline holds)
            self.deadline = self.server.now + self.server.head_timeout

    def on_url(self, url):
        self.url += url
        self._count(len(url))

    def on_header(self, name, value):
        self._count(len(name) + len(value))
        if self.in_body:
            return  # a chunked body's trailer fields: not the request's headers
        if len(self.headers) >= HEADERS_MAX:
            raise _Refused(431, "request_header_fields_too_large",
                           f"More than {HEADERS_MAX} header fields.")
        field = _field(name, value)
        if (field[0] == b"content-length" and value.isdigit()
                and int(value) > self.server.body_max):
            raise _Refused(413, "too_large", f"Request body is over {self.server.body_max} bytes.")
        self.headers.append(field)

    def on_headers_complete(self):
        self.in_body = True

    def on_body(self, body):
        if self.body is None:
            self.body = bytearray()
        self.body += body
        limit = self.server.body_max if self.task is None else PIPELINED_BODY_BYTES
        if len(self.body) > limit:
            raise _Refused(413, "too_large", f"Request body is over {limit} bytes.")

    def on_message_complete(self):
        parser, url = self.parser, httptools.parse_url(self.url)
        if not url.path:
            raise _Refused(400, "invalid", "The request target has no path.")
        version = parser.get_http_version()
        if version not in ("1.0", "1.1"):
            raise _Refused(505, "http_version_not_supported",
                           f"HTTP/{version} is not spoken here: HTTP/1.1 or 1.0.")
        if version == "1.1" and not any(name == b"host" for name, _ in self.headers):
            raise _Refused(400, "invalid", "An HTTP/1.1 request needs a Host header.")
        self.deadline = float("inf")  # the application answers in its own time
        scope = {"type": "http", "asgi": _ASGI, "http_version": version,
                 "method": parser.get_method().decode(), "scheme": "http",
                 "path": unquote(url.path.decode("latin-1")), "raw_path": url.path,
                 "query_string": url.query or b"", "root_path": "", "headers": self.headers,
                 "client": (self.transport.get_extra_info("peername") or (None, None))[:2],
                 "server": self.server.address}
        request = _Request(self, scope, bytes(self.body or b""), parser.should_keep_alive())
        self.url = self.headers = self.body = None
        if self.task is None:
            self._start(request)
        else:  # pipelined: answered when the one before is; a few, their bodies bounded
            if self.queue is None:
                self.queue = collections.deque()
            self.queued_bytes += len(request.body)
            if len(self.queue) >= PIPELINED_MAX or self.queued_bytes > PIPELINED_BODY_BYTES:
                raise _Refused(400, "invalid", "Too many pipelined requests.")
            self.queue.append(request)
            self.transport.pause_reading()  # no more until the queue is answered
        if not request.keep_alive:  # its answer ends the connection
            raise _Ended

    # internals
    def _parse_failed(self, raised: BaseException | None) -> None:
        if isinstance(raised, _Ended):  # nothing after it is a request (RFC 9112 9.6)
            self.parser, self.ended = None, True
        else:
            self._refuse(*(raised.args if isinstance(raised, _Refused)
                           else (400, "invalid", "Malformed HTTP request.")))

    def _count(self, size: int) -> None:
        self.head_bytes += size
        if self.head_bytes > HEAD_MAX_BYTES:
            raise _Refused(431, "request_header_fields_too_large",
                           f"The request head is over {HEAD_MAX_BYTES} bytes.")

    def _refuse(self, status: int, code: str, message: str) -> None:
        """Answer `status` with the API's error envelope (when no answer is under
        way) and close the connection: what follows cannot be trusted."""
        if self.task is None and not self.transport.is_closing():
            body = envelope(code, message)
            self.transport.write(_head(status, [
                (b"content-type", b"application/json"), (b"date", _Date.now()),
                (b"content-length", str(len(body)).encode()), (b"connection", b"close")]) + body)
        self._close()

    def _close(self) -> None:
        """Close once what was written is sent: within SEND_TIMEOUT_S, or dropped."""
        self.deadline = self.server.now + self.server.send_timeout
        self.transport.close()

    def _start(self, request: "_Request") -> None:
        self.request = request
        self.task = self.server.loop.create_task(self._run(request))

    async def _run(self, request: "_Request") -> None:
        try:
            await self.server.app(request.scope, request.receive, request.send)
        except asyncio.CancelledError:
            self.transport.abort()  # (the client left, or the worker stops)
            return
        except Exception:
            logger.exception("unhandled error answering %s %s", request.scope["method"],
                             request.scope["path"])
            if not request.started:
                request.keep_alive = False
                await request.send({"type": "http.response.start", "status": 500,
                                    "headers": [(b"content-length", b"0")]})
                await request.send({"type": "http.response.body"})
        if not request.done:  # the application ended without finishing its answer
            self.transport.abort()
            return
        self.task = self.request = None
        if not request.keep_alive or self.transport.is_closing():
            self._close()
        elif self.queue:
            queued = self.queue.popleft()
            self.queued_bytes -= len(queued.body)
            if not self.queue:
                self.queue = None  # a held poll keeps no empty deque (~700 bytes)
            self._start(queued)
        else:  # idle, or a head begun behind the answer: it has its head's time left
            self.deadline = self.server.now + (
                self.server.keep_alive if self.url is None else self.server.head_timeout)
            self.transport.resume_reading()


class _Request:
    """One request being answered: its scope and body, and the application's ASGI
    receive and send for it."""

    __slots__ = ("connection", "scope", "body", "keep_alive", "started", "head", "with_body",
                 "chunked", "remaining", "done", "disconnected")

    def __init__(self, connection: Connection, scope: dict, body: bytes, keep_alive: bool):
        self.connection, self.scope, self.body, self.keep_alive = (
            connection, scope, body, keep_alive)
        self.head: tuple | None = None  # (status, headers) until the first body
        self.started = self.with_body = self.chunked = self.done = False
        self.remaining: int | None = None  # of the Content-Length the application gave
        self.disconnected: asyncio.Future | None = None

    def disconnect(self) -> None:
        if self.disconnected is not None and not self.disconnected.done():
            self.disconnected.set_result(None)

    async def receive(self) -> dict:
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        if self.disconnected is None:
            self.disconnected = self.connection.server.loop.create_future()
            if self.connection.transport.is_closing():
                self.disconnected.set_result(None)
        await self.disconnected
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        kind, transport = message["type"], self.connection.transport
        if kind == "http.response.start" and not self.started:
            self.started = True
            self.head = (message["status"], list(message.get("headers") or ()))
            return
        if kind != "http.response.body" or not self.started or self.done:
            raise RuntimeError(f"{kind} out of order")
        body, more = message.get("body", b""), message.get("more_body", False)
        if not more:
            self.done = True
        if transport.is_closing():  # the client left: nothing more is written
            return
        # One write per message (the head with the first body): one send, one segment.
        out = [] if self.head is None else [self._head(None if more else len(body))]
        if body and self.with_body:
            if self.remaining is not None:
                self.remaining -= len(body)
            out.append(b"%x\r\n%s\r\n" % (len(body), body) if self.chunked else body)
        if self.done:
            if self.chunked:
                out.append(b"0\r\n\r\n")
            if self.remaining:  # the body was not the length it declared: framing lost
                self.keep_alive = False
        if out:
            transport.write(out[0] if len(out) == 1 else b"".join(out))
        writable = self.connection.writable
        if writable is not None:
            await writable

    def _head(self, length: int | None) -> bytes:
        """The response's head, its framing decided: Content-Length when the
        application gave it or the whole body came at once, chunked otherwise."""
        (status, headers), self.head = self.head, None
        extra = [(b"date", _Date.now())]
        self.with_body = status not in _NO_BODY and self.scope["method"] != "HEAD"
        declared = {name.lower(): value for name, value in headers}
        if b"close" in declared.get(b"connection", b"").lower():
            self.keep_alive = False  # the application closes it (RFC 9112 9.6)
            headers = [(n, v) for n, v in headers if n.lower() != b"connection"]
        if self.with_body and b"content-length" in declared:
            length = declared[b"content-length"]
            self.remaining = int(length) if length.isdigit() else 0
            self.keep_alive = self.keep_alive and length.isdigit()
        elif self.with_body:
            if length is not None:
                extra.append((b"content-length", str(length).encode()))
            elif self.scope["http_version"] == "1.1":
                self.chunked = True
                extra.append((b"transfer-encoding", b"chunked"))
            else:
                self.keep_alive = False  # HTTP/1.0: the body ends with the connection
        if not self.keep_alive:
            extra.append((b"connection", b"close"))
        return _head(status, headers + extra)


class _Refused(Exception):
    """A request refused while parsing: (status, error code, message)."""


class _Ended(Exception):
    """Raised by the request that ends its connection (`Connection: close`, HTTP/1.0
    without keep-alive) to stop the parser: what follows it is never a request."""


def _head(status: int, headers) -> bytes:
    lines = [b"HTTP/1.1 %d %s" % (status, _REASONS.get(status, b""))]
    lines += [name.lower() + b": " + value for name, value in headers]  # as granian sends them
    return b"\r\n".join(lines) + b"\r\n\r\n"


class PollNode:
    """One process's server: the connections it holds and their timeouts."""

    def __init__(self, app, loop: asyncio.AbstractEventLoop, address, *,
                 head_timeout: float = HEAD_TIMEOUT_S, keep_alive: float = KEEP_ALIVE_S,
                 send_timeout: float = SEND_TIMEOUT_S, body_max: int = BODY_MAX_BYTES):
        self.app, self.loop, self.address = app, loop, address
        self.head_timeout, self.keep_alive, self.send_timeout = (
            head_timeout, keep_alive, send_timeout)
        self.body_max = body_max
        self.connections: set[Connection] = set()
        self.now = loop.time()

    def protocol(self) -> Connection:
        return Connection(self)

    async def sweep(self) -> None:
        """Drop connections past their deadline (a head too slow, idle too long, an
        answer not read): aborted, since what is unsent would wait for that client."""
        while True:
            await asyncio.sleep(SWEEP_S)
            self.now = self.loop.time()
            self._drop_overdue()

    def _drop_overdue(self) -> None:  # (a loop in sweep() would keep the last one dropped)
        for connection in [c for c in self.connections if c.deadline <= self.now]:
            connection.transport.abort()


async def serve(sock: socket.socket, app, stop: asyncio.Future | None = None,
                **limits) -> None:
    """Serve `app` on `sock` until `stop` is done (or SIGTERM/SIGINT without one)."""
    loop = asyncio.get_running_loop()
    node = PollNode(app, loop, sock.getsockname()[:2], **limits)
    server = await loop.create_server(node.protocol, sock=sock, backlog=4096)
    if stop is None:
        stop = loop.create_future()
        for signum in (signal.SIGTERM, signal.SIGINT):  # both may come: group and parent
            loop.add_signal_handler(signum, lambda: stop.done() or stop.set_result(None))
    sweeping = loop.create_task(node.sweep())
    await stop
    server.close()
    sweeping.cancel()
    for connection in list(node.connections):  # held polls: agents poll again elsewhere
        connection.transport.close()


def _worker(sock: socket.socket, **limits) -> None:
    import uvloop

    from project.asgi import http_application
    from project.bodylimits import body_limit
    uvloop.run(serve(sock, http_application, body_max=body_limit(), **limits))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m project.pollnode",
        description="Serve the agents' polls (a poll pool's web node): HTTP/1.1, "
                    "project.asgi's application, a few KB per held long-poll.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--workers", type=int, default=1,
                        help="processes sharing the port (one event loop each; the cores)")
    parser.add_argument("--head-timeout", type=float, default=HEAD_TIMEOUT_S, metavar="S",
                        help="close a connection whose request head is not complete in S "
                             "seconds (default %(default)s)")
    parser.add_argument("--keep-alive", type=float, default=KEEP_ALIVE_S, metavar="S",
                        help="close a connection idle S seconds between requests; above "
                             "BELLWETHER_LONG_POLL_MAX_S (default %(default)s)")
    parser.add_argument("--log-level", default="info")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(process)d %(levelname)s %(name)s %(message)s")
    sock = socket.create_server((args.host, args.port), backlog=4096)
    sock.setblocking(False)
    limits = {"head_timeout": args.head_timeout, "keep_alive": args.keep_alive}
    stopping, children = [], {}

    def stop(signum, _frame):
        stopping.append(signum)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for _ in range(max(1, args.workers)):
        _fork_worker(sock, limits, children)
    logger.info("serving on %s:%d, workers %s", args.host, args.port,
                " ".join(map(str, sorted(children))))
    while children:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            break
        started = children.pop(pid, None)
        if started is None or stopping:
            continue
        logger.error("worker %d exited (%s); starting another", pid,
                     os.waitstatus_to_exitcode(status))
        time.sleep(max(0.0, RESPAWN_S - (time.monotonic() - started)))
        if not stopping:  # (a stop during the pause: no new worker)
            _fork_worker(sock, limits, children)
    return 0


_STOPS = {signal.SIGTERM, signal.SIGINT}


def _fork_worker(sock: socket.socket, limits: dict, children: dict) -> None:
    """A worker process serving `sock`; its pid and start time into `children`.
    The stop signals wait while it forks, so the parent's stop() never misses it
    and the child never runs the parent's stop()."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the workers
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)
                _worker(sock, **limits)
            except BaseException:
                logger.exception("worker failed")
                code = 1
            finally:
                logging.shutdown()
                os._exit(code)
        children[pid] = time.monotonic()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _STOPS)


if __name__ == "__main__":
    sys.exit(main())
