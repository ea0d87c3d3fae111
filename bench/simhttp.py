"""The fleet simulator's HTTP/1.1 client: one keep-alive connection per simulated
agent, its responses parsed as they arrive by an asyncio protocol.

It shares the machine with the servers it measures, so it should take as little of
it as it can: asyncio's streams wake a reader per read and a timeout per request
puts a timer on the loop and takes it off again, which cost the simulator more than
the HTTP itself. Here a response is parsed in the protocol's callback and completes
one future, and the requests' deadlines are checked twice a second by one task.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

USER_AGENT = "bellwether-fleet-sim/1"
DEADLINE_CHECK_S = 0.5
_NO_BODY = frozenset({204, 304})


def response_of(buffer: bytearray, head_only: bool, eof: bool):
    """(status, headers with lower-case names, body) of the response at the start of
    `buffer`, which it removes from it; None while it is incomplete. Without a
    length the body ends at `eof` (the server closed the connection)."""
    end = buffer.find(b"\r\n\r\n")
    if end < 0:
        return None
    status_line, *lines = buffer[:end].decode("latin-1").split("\r\n")
    status = int(status_line.split()[1])
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    start = end + 4
    if head_only or status in _NO_BODY or 100 <= status < 200:
        stop, body = start, b""
    elif headers.get("transfer-encoding", "").lower() == "chunked":
        chunked = _chunked(buffer, start)
        if chunked is None:
            return None
        body, stop = chunked
    elif "content-length" in headers:
        stop = start + int(headers["content-length"])
        if len(buffer) < stop:
            return None
        body = bytes(buffer[start:stop])
    elif eof:
        stop, body = len(buffer), bytes(buffer[start:])
        headers["connection"] = "close"
    else:
        return None
    del buffer[:stop]
    return status, headers, body


def _chunked(buffer: bytearray, at: int) -> tuple[bytes, int] | None:
    """A chunked body starting at `at` and where it ends (trailers skipped), or None
    while incomplete."""
    chunks = []
    while True:
        eol = buffer.find(b"\r\n", at)
        if eol < 0:
            return None
        size = int(bytes(buffer[at:eol]).split(b";")[0], 16)
        at = eol + 2
        if size == 0:
            break
        if len(buffer) < at + size + 2:
            return None
        chunks.append(bytes(buffer[at:at + size]))
        at += size + 2
    while (eol := buffer.find(b"\r\n", at)) >= 0:  # trailers, then an empty line
        empty, at = eol == at, eol + 2
        if empty:
            return b"".join(chunks), at
    return None


class _Wire(asyncio.Protocol):
    """One TCP connection: the response of the request in flight, parsed as its
    bytes arrive."""

    def __init__(self):
        self.transport = None
        self.buffer = bytearray()
        self.response: asyncio.Future | None = None
        self.head_only = False
        self.deadline = 0.0

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self._answer(eof=False)

    def connection_lost(self, exc) -> None:
        self._answer(eof=True)

    def _answer(self, eof: bool) -> None:
        response = self.response
        if response is None or response.done():
            return
        try:
            parsed = response_of(self.buffer, self.head_only, eof)
        except (ValueError, IndexError) as exc:  # not HTTP: the request fails, not retried
            response.set_exception(ValueError(f"unreadable response: {exc}"))
            return
        if parsed is not None:
            response.set_result(parsed)
        elif eof:
            response.set_exception(asyncio.IncompleteReadError(bytes(self.buffer), None))


class _Deadlines:
    """The wires with a request in flight and when each must be answered; one task
    per event loop fails those past it with TimeoutError."""

    def __init__(self):
        self.waiting: set[_Wire] = set()
        self.task: asyncio.Task | None = None

    def watch(self, wire: _Wire) -> None:
        self.waiting.add(wire)
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.task = loop.create_task(self._check(loop))

    async def _check(self, loop) -> None:
        while self.waiting:
            await asyncio.sleep(DEADLINE_CHECK_S)
            now = loop.time()
            for wire in [w for w in self.waiting if w.deadline <= now]:
                self.waiting.discard(wire)
                if wire.response is not None and not wire.response.done():
                    wire.response.set_exception(TimeoutError())


_deadlines = _Deadlines()


class Connection:
    """One keep-alive HTTP/1.1 connection, opened on first use and again after the
    server closed it."""

    def __init__(self, url: str):
        parts = urlsplit(url)
        self.host, self.port = parts.hostname, parts.port or 80
        self.wire: _Wire | None = None
        self.fixed = (f"Host: {self.host}:{self.port}\r\nUser-Agent: {USER_AGENT}\r\n"
                      "Accept: application/json\r\n")

    async def request(self, method: str, path: str, *, headers: dict | None = None,
                      body: bytes | None = None, timeout: float = 30.0):
        """(status, headers with lower-case names, body), or TimeoutError after
        `timeout` seconds. A kept-alive connection the server closed meanwhile is
        opened again once."""
        for attempt in (0, 1):
            reused = self.wire is not None and not self.wire.transport.is_closing()
            try:
                return await self._exchange(method, path, headers, body, timeout)
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                if attempt or not reused:
                    raise
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    async def _exchange(self, method, path, headers, body, timeout):
        loop = asyncio.get_running_loop()
        if self.wire is None or self.wire.transport.is_closing():
            async with asyncio.timeout(timeout):
                _, self.wire = await loop.create_connection(_Wire, self.host, self.port)
        wire = self.wire
        lines = [f"{method} {path} HTTP/1.1\r\n", self.fixed]
        lines += [f"{name}: {value}\r\n" for name, value in (headers or {}).items()]
        if body is not None:
            lines.append(f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n")
        lines.append("\r\n")
        wire.response, wire.head_only = loop.create_future(), method == "HEAD"
        wire.deadline = loop.time() + timeout
        _deadlines.watch(wire)
        try:
            wire.transport.write("".join(lines).encode("latin-1") + (body or b""))
            status, answer, content = await wire.response
        finally:
            wire.response = None
            _deadlines.waiting.discard(wire)
        if answer.get("connection", "").lower() == "close":
            self.close()
        return status, answer, content

    def close(self) -> None:
        if self.wire is not None:
            self.wire.transport.close()
        self.wire = None
