"""The poll node's HTTP/1.1 server (project/pollnode.py) with small ASGI
applications: framing, keep-alive, pipelining, the bounds on what a client sends,
timeouts, a client leaving, an application failing. Real sockets, a real uvloop
loop on a thread; Django's application behind it is tested end to end in
tests/e2e/test_poll_node.py."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import socket
import threading
import time

import pytest
import uvloop

from project import pollnode


class Node:
    """pollnode.serve() of `app` on a thread; `cancelled` names the requests whose
    tasks were cancelled (their clients left)."""

    def __init__(self, app, **limits):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.setblocking(False)
        self.port = self.sock.getsockname()[1]
        self.loop = uvloop.new_event_loop()
        self.stop = self.loop.create_future()
        self.thread = threading.Thread(
            target=self.loop.run_until_complete,
            args=(pollnode.serve(self.sock, app, self.stop, **limits),), daemon=True)
        self.thread.start()

    def close(self):
        self.loop.call_soon_threadsafe(self.stop.set_result, None)
        self.thread.join(5)
        self.sock.close()

    def connect(self) -> Client:
        return Client(socket.create_connection(("127.0.0.1", self.port), timeout=5))


class Client:
    """A raw HTTP/1.1 client connection: what is sent, and the responses read off it
    one at a time (bytes read past one response kept for the next)."""

    def __init__(self, sock: socket.socket):
        self.sock, self.buffer = sock, b""

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def _more(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed; unread {self.buffer!r}")
        self.buffer += chunk

    def response(self, *, head_only: bool = False) -> tuple[int, dict, bytes]:
        """One response: status, headers (lower-case names), body."""
        while b"\r\n\r\n" not in self.buffer:
            self._more()
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(status_line.split()[1])
        if head_only or status in (204, 304):
            return status, headers, b""
        if "content-length" in headers:
            length = int(headers["content-length"])
            while len(self.buffer) < length:
                self._more()
            body, self.buffer = self.buffer[:length], self.buffer[length:]
            return status, headers, body
        if headers.get("transfer-encoding") == "chunked":
            body = b""
            while True:
                while b"\r\n" not in self.buffer:
                    self._more()
                size_line, self.buffer = self.buffer.split(b"\r\n", 1)
                size = int(size_line, 16)
                while len(self.buffer) < size + 2:
                    self._more()
                body, self.buffer = body + self.buffer[:size], self.buffer[size + 2:]
                if size == 0:
                    return status, headers, body
        with contextlib.suppress(ConnectionError):  # the body ends with the connection
            while True:
                self._more()
        body, self.buffer = self.buffer, b""
        return status, headers, body

    def closed(self, timeout: float = 5) -> bool:
        """Whether the server closed the connection within `timeout` (what comes
        before is read and dropped)."""
        self.sock.settimeout(timeout)
        try:
            while self.sock.recv(65536):
                pass
            return True
        except TimeoutError:
            return False
        except ConnectionResetError:
            return True


async def echo(scope, receive, send):
    """Answers with what it was asked: method, path, query, headers and body."""
    message = await receive()
    body = (f"{scope['method']} {scope['path']} {scope['query_string'].decode()} "
            f"{dict(scope['headers']).get(b'x-test', b'').decode()} ").encode() + message["body"]
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": body})


@pytest.fixture
def node():
    started = []

    def start(app=echo, **limits):
        started.append(Node(app, **limits))
        return started[-1]
    yield start
    for each in started:
        each.close()


def test_a_request_is_answered_with_its_length_and_the_connection_kept(node):
    server = node()
    client = server.connect()
    for number in range(3):
        client.sendall(f"GET /p/{number}?a=1 HTTP/1.1\r\nHost: x\r\nX-Test: t\r\n\r\n".encode())
        status, headers, body = client.response()
        assert (status, body) == (200, f"GET /p/{number} a=1 t ".encode())
        assert headers["content-length"] == str(len(body)) and "date" in headers
        assert "connection" not in headers


def test_the_path_is_percent_decoded_and_the_raw_path_kept(node):
    seen = []

    async def app(scope, receive, send):
        seen.append((scope["path"], scope["raw_path"], scope["query_string"]))
        await echo(scope, receive, send)

    client = node(app).connect()
    client.sendall(b"GET /a%20b/%C3%A9?x=%20 HTTP/1.1\r\nHost: x\r\n\r\n")
    assert client.response()[0] == 200
    assert seen == [("/a b/\u00e9", b"/a%20b/%C3%A9", b"x=%20")]


def test_a_body_reaches_the_application(node):
    client = node().connect()
    client.sendall(b"POST /in HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    assert client.response()[2] == b"POST /in   hello"
    client.sendall(b"POST /in HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                   b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n")
    assert client.response()[2] == b"POST /in   abcde"


def test_pipelined_requests_are_answered_in_order(node):
    async def slow_first(scope, receive, send):
        if scope["path"] == "/slow":
            await asyncio.sleep(0.3)
        await echo(scope, receive, send)

    client = node(slow_first).connect()
    client.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\nGET /fast HTTP/1.1\r\nHost: x\r\n\r\n"
                   b"GET /last HTTP/1.1\r\nHost: x\r\n\r\n")
    bodies = [client.response()[2] for _ in range(3)]
    assert [b.split()[1] for b in bodies] == [b"/slow", b"/fast", b"/last"]


def test_an_answered_pipeline_leaves_no_queue_on_the_connection(node):
    """A request arriving while the one before still runs is queued; once answered,
    the connection keeps no queue through the long-poll that follows."""
    held = []

    async def app(scope, receive, send):
        if scope["path"] == "/hold":
            held.append(scope)
            await asyncio.sleep(3600)
        await echo(scope, receive, send)

    server = node(app)
    client = server.connect()
    client.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
    assert client.response()[2].split()[1] == b"/a"
    deadline = time.monotonic() + 5
    while not held and time.monotonic() < deadline:
        time.sleep(0.01)

    async def queues():  # of the connections whose requests are running
        return [task.get_coro().cr_frame.f_locals["self"].queue for task in asyncio.all_tasks()
                if task.get_coro().__qualname__ == "Connection._run"]
    assert held
    assert asyncio.run_coroutine_threadsafe(queues(), server.loop).result(5) == [None]


def test_header_fields_are_lowered_and_shared_but_never_a_credential(node):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["headers"])
        await echo(scope, receive, send)

    client = node(app).connect()
    for _ in range(2):
        client.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\nIf-None-Match: \"e1\"\r\n"
                       b"X-Test: same\r\nAuthorization: Bearer s3cret\r\n"
                       b"X-CSRFToken: c5rf\r\nCookie: sessionid=k3y\r\n\r\n")
        assert client.response()[2].split()[2] == b"same"
    first, second = seen
    assert first == second == [
        (b"host", b"x"), (b"if-none-match", b'"e1"'), (b"x-test", b"same"),
        (b"authorization", b"Bearer s3cret"), (b"x-csrftoken", b"c5rf"),
        (b"cookie", b"sessionid=k3y")]
    assert first[0] is second[0] and first[1] is second[1]  # one copy, not one a request
    assert not any(a is b for a, b in zip(first[2:], second[2:], strict=True))
    kept = b" ".join(value for _, value in pollnode._FIELDS.values())
    assert b"s3cret" not in kept and b"c5rf" not in kept and b"k3y" not in kept


def test_the_shared_header_fields_stay_bounded_under_junk(node):
    client = node().connect()
    for start in range(0, 3 * pollnode._FIELDS_MAX, 90):
        junk = b"".join(b"Accept: %d\r\n" % n for n in range(start, start + 90))
        client.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\n" + junk + b"X-Test: ok\r\n\r\n")
        assert client.response()[2].split()[2] == b"ok"
        assert len(pollnode._FIELDS) <= pollnode._FIELDS_MAX


def test_connection_close_and_http_1_0_end_the_connection(node):
    server = node()
    client = server.connect()
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    status, headers, _ = client.response()
    assert (status, headers["connection"]) == (200, "close") and client.closed()
    client = server.connect()
    client.sendall(b"GET / HTTP/1.0\r\n\r\n")
    assert client.response()[0] == 200 and client.closed()


def test_a_streamed_body_is_chunked_and_a_head_request_gets_no_body(node):
    async def streamed(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for part in (b"one ", b"two ", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    server = node(streamed)
    client = server.connect()
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = client.response()
    assert (headers["transfer-encoding"], body) == ("chunked", b"one two three")
    client.sendall(b"HEAD / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = client.response(head_only=True)
    assert status == 200
    assert client.response()[2] == b"one two three"  # the HEAD's body was not sent
    old = server.connect()
    old.sendall(b"GET / HTTP/1.0\r\n\r\n")
    status, headers, body = old.response()
    assert "transfer-encoding" not in headers and body == b"one two three" and old.closed()


class Written:
    """A connection whose transport keeps each write."""

    def __init__(self):
        self.transport, self.writable, self.writes = self, None, []

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return False


def test_an_answer_leaves_in_one_write_and_a_stream_in_one_per_part():
    """The head goes with the first body (one send, one segment: after a publish
    the node answers thousands of agents at once)."""
    async def answered(*bodies):
        connection = Written()
        request = pollnode._Request(connection, {"method": "GET", "http_version": "1.1"},
                                    b"", keep_alive=True)
        await request.send({"type": "http.response.start", "status": 200, "headers": []})
        for body in bodies[:-1]:
            await request.send({"type": "http.response.body", "body": body, "more_body": True})
        await request.send({"type": "http.response.body", "body": bodies[-1]})
        return connection.writes

    whole = asyncio.run(answered(b"{}"))
    streamed = asyncio.run(answered(b"one", b"two", b""))

    assert len(whole) == 1 and whole[0].endswith(b"content-length: 2\r\n\r\n{}")
    assert [streamed[0].split(b"\r\n\r\n", 1)[1], *streamed[1:]] == [
        b"3\r\none\r\n", b"3\r\ntwo\r\n", b"0\r\n\r\n"]


def test_a_304_has_no_body_whatever_the_application_sends(node):
    async def not_modified(scope, receive, send):
        await send({"type": "http.response.start", "status": 304, "headers": [(b"etag", b'"1"')]})
        await send({"type": "http.response.body", "body": b"ignored"})

    client = node(not_modified).connect()
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n")
    for _ in range(2):
        status, headers, _ = client.response()
        assert (status, headers["etag"]) == (304, '"1"') and "content-length" not in headers
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert client.response()[0] == 304 and client.buffer == b""  # no stray body bytes


@pytest.mark.parametrize("request_bytes, status", [
    (b"NOT HTTP AT ALL\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
    (b"GET / HTTP/1.1\r\nBad Header Name: x\r\n\r\n", 400),
    (b"GET http://example.com HTTP/1.1\r\nHost: x\r\n\r\n", 400),
    (b"GET / HTTP/1.1\r\nX-Test: no host\r\n\r\n", 400),
    (b"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
    (b"GET / HTTP/1.2\r\nHost: x\r\n\r\n", 400),  # (llhttp refuses it as malformed)
    (b"GET / HTTP/1.1\r\nX-Big: " + b"a" * (pollnode.HEAD_MAX_BYTES + 1) + b"\r\n\r\n", 431),
    (b"GET /" + b"a" * (pollnode.HEAD_MAX_BYTES + 1) + b" HTTP/1.1\r\n\r\n", 431),
    (b"GET / HTTP/1.1\r\n" + b"X-A: b\r\n" * (pollnode.HEADERS_MAX + 1) + b"\r\n", 431),
    (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n" + b"a" * 1001, 413),
    (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
     + b"3e8\r\n" + b"a" * 1000 + b"\r\n2\r\nab\r\n0\r\n\r\n", 413),
])
def test_hostile_requests_are_refused_and_the_connection_closed(node, request_bytes, status):
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await echo(scope, receive, send)

    server = node(app, body_max=1000)
    client = server.connect()
    client.sendall(request_bytes)
    answer, headers, body = client.response()
    assert (answer, headers["content-type"]) == (status, "application/json")
    assert set(json.loads(body)["error"]) == {"code", "message"}
    assert client.closed()
    assert reached == []
    fresh = server.connect()  # the server is unharmed
    fresh.sendall(b"GET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert fresh.response()[0] == 200


def _connections() -> int:
    return sum(type(o) is pollnode.Connection for o in gc.get_objects())


@pytest.mark.parametrize("cut_off", ["client leaves", "over the limit", "malformed", "too slow"])
def test_a_request_cut_off_mid_body_is_freed_without_a_collection(node, cut_off):
    """Each way a request can end mid-body frees what it sent at once: the parser
    and the connection hold each other, so otherwise its bytes (up to the body
    limit, from anyone, no token needed) stayed until the collector ran, which the
    workers run rarely (project/gc_tuning.py): 20 such requests a second grew a
    worker by 200 MB a second."""
    server = node(body_max=4_000_000, head_timeout=1)
    gc.collect()
    before = _connections()
    gc.disable()
    try:
        client = server.connect()
        if cut_off == "client leaves":
            client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3000000\r\n\r\n"
                           + b"a" * 2_000_000)
            time.sleep(0.3)
            client.close()
        else:
            client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                           + b"1e8480\r\n" + b"a" * 2_000_000 + b"\r\n")
            client.sendall({"over the limit": b"1e8480\r\n" + b"a" * 2_000_000 + b"\r\n",
                            "malformed": b"zz\r\n", "too slow": b""}[cut_off])
            assert client.closed(timeout=5)
        deadline = time.monotonic() + 5
        while _connections() > before and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _connections() == before
    finally:
        gc.enable()


@pytest.mark.parametrize("after", [b"X", b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
                                   b"NOT HTTP\r\n\r\n"])
def test_nothing_after_a_request_that_ends_its_connection_is_read(node, after):
    """RFC 9112 9.6: the request with `Connection: close` is answered; what follows
    it on the connection is not a request (it cost the answer before)."""
    paths = []

    async def app(scope, receive, send):
        paths.append(scope["path"])
        await echo(scope, receive, send)

    client = node(app).connect()
    client.sendall(b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" + after)
    status, headers, body = client.response()
    assert (status, body.split()[1]) == (200, b"/a")
    assert client.closed()
    assert paths == ["/a"]


def test_an_upgrade_is_answered_as_http_and_the_connection_closed(node):
    client = node().connect()
    client.sendall(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\n"
                   b"Upgrade: websocket\r\n\r\n\x81\x05hello")
    status, headers, body = client.response()
    assert (status, headers["connection"], body) == (200, "close", b"GET /ws   ")
    assert client.closed()


def test_trailer_fields_are_not_request_headers(node):
    client = node().connect()
    client.sendall(b"POST /in HTTP/1.1\r\nHost: x\r\nTrailer: X-Test\r\n"
                   b"Transfer-Encoding: chunked\r\n\r\n2\r\nab\r\n0\r\nX-Test: evil\r\n\r\n")
    assert client.response()[2] == b"POST /in   ab"  # no X-Test seen by the application


def test_a_flood_of_pipelined_requests_is_refused(node):
    calls = []

    async def slow(scope, receive, send):
        calls.append(scope["path"])
        await asyncio.sleep(0.5)
        await echo(scope, receive, send)

    server = node(slow)
    client = server.connect()
    client.sendall(b"GET /n HTTP/1.1\r\nHost: x\r\n\r\n" * (pollnode.PIPELINED_MAX + 20))
    assert client.closed()
    assert len(calls) <= 1
    fresh = server.connect()
    fresh.sendall(b"GET /n HTTP/1.1\r\nHost: x\r\n\r\n" * pollnode.PIPELINED_MAX)
    assert [fresh.response()[0] for _ in range(pollnode.PIPELINED_MAX)] == [
        200] * pollnode.PIPELINED_MAX


def test_empty_lines_do_not_keep_an_idle_connection_open(node):
    server = node(head_timeout=3, keep_alive=4)
    client = server.connect()
    client.sock.settimeout(2)
    started, closed_after = time.monotonic(), None
    while time.monotonic() - started < 12:  # a CRLF every 2 s: no request ever begins
        try:
            client.sock.sendall(b"\r\n")
            if client.sock.recv(1) == b"":
                closed_after = time.monotonic() - started
                break
        except TimeoutError:
            continue
        except OSError:
            closed_after = time.monotonic() - started
            break
    assert closed_after is not None and closed_after < 6.5  # keep-alive 4 s + the sweep


def test_a_client_that_does_not_read_its_answer_is_dropped(node):
    finished = threading.Event()

    async def large(scope, receive, send):
        try:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for _ in range(400):  # 25 MB, far more than the socket buffers hold
                await send({"type": "http.response.body", "body": b"x" * 65536,
                            "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            finished.set()

    client = node(large, send_timeout=1).connect()
    client.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
    assert finished.wait(10)


def test_the_applications_framing_is_kept_or_the_connection_closed(node):
    async def app(scope, receive, send):
        declared = {"/short": b"10", "/close": b"2"}.get(scope["path"], b"2")
        headers = [(b"content-length", declared)]
        if scope["path"] == "/close":
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    server = node(app)
    client = server.connect()
    client.sendall(b"GET /right HTTP/1.1\r\nHost: x\r\n\r\n")
    assert client.response()[2] == b"ok" and not client.closed(timeout=0.3)
    short = server.connect()  # a body shorter than it said: not kept alive
    short.sendall(b"GET /short HTTP/1.1\r\nHost: x\r\n\r\n")
    assert short.closed()
    closing = server.connect()  # the application says close: closed
    closing.sendall(b"GET /close HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = closing.response()
    assert (headers["connection"], body) == ("close", b"ok") and closing.closed()


def test_a_slow_head_and_an_idle_connection_are_closed(node):
    server = node(head_timeout=1, keep_alive=2)
    slow = server.connect()
    slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finished
    idle = server.connect()
    idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert idle.response()[0] == 200
    started = time.monotonic()
    assert slow.closed(timeout=5)
    assert 0.9 <= time.monotonic() - started <= 3
    assert idle.closed(timeout=5)
    assert time.monotonic() - started >= 1.5


def test_a_head_begun_behind_an_answer_has_the_head_timeout_not_the_keep_alive(node):
    """A request head started while a poll was held and never finished: once the
    poll is answered the connection is closed after the head timeout, not kept for
    the idle connections' keep-alive."""
    release = threading.Event()

    async def held(scope, receive, send):
        while not release.is_set():
            await asyncio.sleep(0.05)
        await echo(scope, receive, send)

    client = node(held, head_timeout=1, keep_alive=30).connect()
    client.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n\r\nGET /next HTTP/1.1\r\nHost")
    time.sleep(0.3)
    release.set()
    assert client.response()[0] == 200
    started = time.monotonic()
    assert client.closed(timeout=5)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("closing", [b"", b"Connection: close\r\n"])
def test_a_held_request_is_not_timed_out_and_is_cancelled_when_its_client_leaves(node, closing):
    """Also with `Connection: close`, as the agent's urllib sends every request."""
    cancelled, release = threading.Event(), asyncio.Event()

    async def held(scope, receive, send):
        try:
            await asyncio.wait_for(release.wait(), 30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        await echo(scope, receive, send)

    server = node(held, head_timeout=0.5, keep_alive=0.5)
    client = server.connect()
    client.sendall(b"GET /held HTTP/1.1\r\nHost: x\r\n" + closing + b"\r\n")
    assert not client.closed(timeout=2.5)  # held longer than both timeouts
    client.close()
    assert cancelled.wait(5)


def test_a_disconnect_is_received_by_an_application_listening_for_it(node):
    told = threading.Event()

    async def listening(scope, receive, send):  # as Django does: not cancelled, told
        await receive()
        if (await receive())["type"] == "http.disconnect":
            told.set()

    client = node(listening).connect()
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    time.sleep(0.2)
    client.close()
    assert told.wait(5)


def test_an_application_error_is_a_500_and_an_unfinished_answer_closes(node, caplog):
    async def failing(scope, receive, send):
        if scope["path"] == "/unfinished":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"part", "more_body": True})
            return
        raise ValueError("boom")

    server = node(failing)
    client = server.connect()
    client.sendall(b"GET /fails HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = client.response()
    assert (status, headers["connection"]) == (500, "close") and client.closed()
    assert "unhandled error answering GET /fails" in caplog.text
    client = server.connect()
    client.sendall(b"GET /unfinished HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, body = client.response(head_only=True)
    assert status == 200 and client.closed()


def test_messages_out_of_order_fail_the_request(node, caplog):
    async def twice(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.start", "status": 200, "headers": []})

    client = node(twice).connect()
    client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert client.closed()
    assert "http.response.start out of order" in caplog.text


def test_the_command_explains_itself():
    """`python -m project.pollnode --help` works; the server itself runs in
    tests/e2e/test_poll_node.py (it needs the project's services)."""
    import subprocess
    import sys

    shown = subprocess.run([sys.executable, "-m", "project.pollnode", "--help"],
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--head-timeout" in shown.stdout
