"""The fleet simulator's HTTP client (bench/simhttp.py) against a raw socket server:
every framing the agent protocol's servers use, answers split anywhere, a kept-alive
connection the server closed, a server that never answers or breaks off."""

import asyncio
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import simhttp  # noqa: E402


class RawServer:
    """Answers each request with the next of `answers` (bytes; None: close the
    connection without answering; ... : never answer), written `step` bytes at a
    time, and closes the connection after the last; counts connections and records
    the requests."""

    def __init__(self, answers, step=None):
        self.answers, self.step = list(answers), step
        self.connections, self.requests = 0, []

    async def __aenter__(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()

    async def _serve(self, reader, writer):
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = [int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:")]
                body = await reader.readexactly(length[0]) if length else b""
                self.requests.append((head.decode("latin-1"), body))
                answer = self.answers.pop(0)
                if answer is ...:
                    await asyncio.sleep(3600)
                if answer is None:
                    break
                step = self.step or len(answer)
                for at in range(0, len(answer), step):
                    writer.write(answer[at:at + step])
                    await writer.drain()
                    await asyncio.sleep(0)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nETag: \"a\"\r\n\r\nhello"
CHUNKED = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"3;ext=1\r\nabc\r\n4\r\ndefg\r\n0\r\nX-Trailer: 1\r\n\r\n")


@pytest.mark.parametrize("step", [None, 1, 7])
async def test_answers_are_read_whole_however_they_arrive_on_one_kept_connection(step):
    answers = [OK, CHUNKED, b"HTTP/1.1 304 Not Modified\r\nETag: \"a\"\r\n\r\n",
               b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", OK]
    async with RawServer(answers, step) as server:
        connection = simhttp.Connection(server.url)
        got = [await connection.request("GET", "/a", headers={"If-None-Match": '"a"'}),
               await connection.request("GET", "/b"),
               await connection.request("GET", "/c"),
               await connection.request("HEAD", "/d"),
               await connection.request("POST", "/e", body=b'{"x": 1}')]
        connection.close()

    assert [(status, body) for status, _, body in got] == [
        (200, b"hello"), (200, b"abcdefg"), (304, b""), (200, b""), (200, b"hello")]
    assert got[0][1]["etag"] == '"a"'
    assert server.connections == 1
    head, body = server.requests[4]
    assert head.startswith("POST /e HTTP/1.1\r\n") and body == b'{"x": 1}'
    assert "Content-Length: 8\r\n" in head and "Content-Type: application/json\r\n" in head
    assert 'If-None-Match: "a"\r\n' in server.requests[0][0]


async def test_a_body_without_length_ends_when_the_server_closes():
    async with RawServer([b"HTTP/1.1 200 OK\r\n\r\nuntil the end"], step=4) as server:
        connection = simhttp.Connection(server.url)
        status, headers, body = await connection.request("GET", "/")

    assert (status, body) == (200, b"until the end")
    assert connection.wire is None  # not kept


async def test_a_kept_connection_the_server_closed_is_opened_again_once():
    closing = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    async with RawServer([OK, None, OK, closing, OK]) as server:
        connection = simhttp.Connection(server.url)
        first = await connection.request("GET", "/")
        second = await connection.request("GET", "/")  # closed unanswered: again
        third = await connection.request("GET", "/")
        fourth = await connection.request("GET", "/")  # after Connection: close

    assert [r[0] for r in (first, second, third, fourth)] == [200, 200, 200, 200]
    assert third[2] == b"ok" and fourth[2] == b"hello"
    assert server.connections == 3


async def test_a_new_connection_closed_unanswered_fails_at_once():
    async with RawServer([None]) as server:
        with pytest.raises(asyncio.IncompleteReadError):
            await simhttp.Connection(server.url).request("GET", "/")


async def test_an_answer_broken_off_fails_the_request():
    async with RawServer([b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort"]) as server:
        with pytest.raises(asyncio.IncompleteReadError):
            await simhttp.Connection(server.url).request("GET", "/")


async def test_an_answer_that_is_not_http_fails_the_request_once():
    async with RawServer([OK, b"SSH-2.0-nope\r\nwhat\r\n\r\n", OK]) as server:
        connection = simhttp.Connection(server.url)
        await connection.request("GET", "/")
        with pytest.raises(ValueError, match="unreadable response"):
            await connection.request("POST", "/reports", body=b"{}")  # kept: not sent again

    assert len(server.requests) == 2 and server.connections == 1


async def test_a_kept_connection_closed_while_idle_is_replaced_without_a_retry():
    async with RawServer([OK]) as server:
        connection = simhttp.Connection(server.url)
        await connection.request("GET", "/")
        await asyncio.sleep(0.2)  # the server closed it after its last answer
        assert connection.wire.transport.is_closing()
        with pytest.raises(asyncio.IncompleteReadError):  # a new one, which it closes too
            await connection.request("GET", "/")

    assert server.connections == 2


async def test_an_unanswered_request_times_out_and_its_connection_is_dropped(monkeypatch):
    monkeypatch.setattr(simhttp, "DEADLINE_CHECK_S", 0.05)
    async with RawServer([..., OK]) as server:
        connection = simhttp.Connection(server.url)
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await connection.request("GET", "/", timeout=0.3)
        waited = time.monotonic() - started
        assert connection.wire is None
        status, _, body = await connection.request("GET", "/")  # a new connection

    assert 0.3 <= waited < 2.0
    assert (status, body) == (200, b"hello") and server.connections == 2
