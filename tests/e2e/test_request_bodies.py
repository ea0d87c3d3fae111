"""End to end against the production server (granian serving project.asgi) with raw
socket clients: request bodies are bounded while they are received (413 with the
envelope, connection closed, the server's memory flat while 200 MB stream in), and
chunked bodies are read, never taken for empty."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.fleet.models import Agent, Deployment
from tests import factories
from tests.e2e.harness import Server, free_port

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

LIMIT = 1024 * 1024
STREAM = 200 * 1024 * 1024
RSS_GROWTH_MAX_KB = 40 * 1024


@pytest.fixture
def bounded_server(processes, server_environ, tmp_path) -> Server:
    environ = {**server_environ, "BELLWETHER_MAX_REQUEST_BYTES": str(LIMIT)}
    server = Server.production(port=free_port(), env=environ, log_path=tmp_path / "server.log")
    processes.append(server)
    return server.start().wait_ready()


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def exchange(server: Server, head: bytes, chunks, token: str | None = None) -> bytes:
    """Send a request head and body chunks over a raw socket; return all it answers
    until the server closes (a send the server refused ends the sending)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        if token:
            head = head.replace(b"\r\n\r\n", f"\r\nAuthorization: Bearer {token}\r\n\r\n".encode())
        sock.sendall(head)
        try:
            for chunk in chunks:
                sock.sendall(chunk)
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = b""
        try:
            while data := sock.recv(65536):
                answer += data
        except ConnectionResetError:
            pass
        return answer


def chunked(payload: bytes, size: int = 64 * 1024):
    for start in range(0, len(payload), size):
        piece = payload[start:start + size]
        yield b"%x\r\n%s\r\n" % (len(piece), piece)
    yield b"0\r\n\r\n"


def endless_chunks(total: int, size: int = 64 * 1024):
    piece = b"x" * size
    for _ in range(total // size):
        yield b"%x\r\n%s\r\n" % (size, piece)
    yield b"0\r\n\r\n"


def plain(total: int, size: int = 64 * 1024):
    piece = b"x" * size
    for _ in range(total // size):
        yield piece


def status_and_body(answer: bytes) -> tuple[int, dict | None]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, None


def request_head(method: str, path: str, *, length: int | None = None) -> bytes:
    framing = (f"Content-Length: {length}" if length is not None
               else "Transfer-Encoding: chunked")
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nConnection: close\r\n{framing}\r\n\r\n"
            ).encode()


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_200_mb_body_is_refused_with_413_while_it_streams_and_memory_stays_flat(
        bounded_server, framing):
    pid = bounded_server.process.pid
    before = rss_kb(pid)
    if framing == "chunked":
        answer = exchange(bounded_server, request_head("POST", "/api/v1/agent/enroll"),
                          endless_chunks(STREAM))
    else:
        answer = exchange(bounded_server,
                          request_head("POST", "/api/v1/agent/enroll", length=STREAM),
                          plain(STREAM))
    growth = rss_kb(pid) - before
    status, body = status_and_body(answer)
    assert status == 413, answer[:300]
    assert body == {"error": {"code": "too_large",
                              "message": f"Request body is over {LIMIT} bytes."}}
    assert b"connection: close" in answer.lower()
    assert growth < RSS_GROWTH_MAX_KB, f"RSS grew by {growth} kB"
    # The server still answers.
    assert status_and_body(exchange(bounded_server, b"GET /healthz HTTP/1.1\r\n"
                                    b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n", []))[0] == 200


def test_a_body_just_under_the_limit_is_read_and_one_byte_over_is_413(
        bounded_server, environment, first, superuser):
    """An agent's chunked report of nearly the limit reaches the API whole (its
    message is refused by name: too long); one byte over the limit is 413."""
    agent = factories.enrolled_agent(environment, actor=superuser)
    under = json.dumps({"deployment_id": None, "snapshot": first.number,
                        "checksum": first.checksum, "status": "succeeded",
                        "message": "m" * (LIMIT - 300)}).encode()
    status, body = status_and_body(exchange(
        bounded_server, request_head("POST", "/api/v1/agent/reports"), chunked(under),
        token=agent.token))
    assert status == 400 and body["error"]["details"][0]["field"] == "message", body
    over = b" " * (LIMIT + 1)
    status, _ = status_and_body(exchange(
        bounded_server, request_head("POST", "/api/v1/agent/reports"), chunked(over),
        token=agent.token))
    assert status == 413


@pytest.fixture
def fleet_of_two(make_fleet):
    fleet = make_fleet("message: hi\n", {"a.txt": "{{ message }}\n"})
    number = fleet.api.publish()["number"]
    agents = factories.enrolled_agents(fleet.environment, 2, actor=fleet.actor)
    return fleet, number, agents


def test_a_chunked_deploy_to_one_agent_pushes_to_that_agent_only(fleet_of_two):
    fleet, number, agents = fleet_of_two
    path = f"{fleet.api.env_path}/snapshots/{number}/deploy"
    body = json.dumps({"agents": [agents[0].agent.pk]}).encode()
    status, answer = status_and_body(exchange(
        fleet.server, request_head("POST", path), chunked(body, 3), token=fleet.api.token))
    assert status == 201, answer
    assert [d["agent"] for d in answer] == [agents[0].agent.pk]
    assert list(Deployment.objects.filter(kind="push").values_list("agent_id", flat=True)) == [
        agents[0].agent.pk]


def test_a_deploy_with_an_empty_chunked_body_is_400_and_pushes_nothing(fleet_of_two):
    fleet, number, _ = fleet_of_two
    path = f"{fleet.api.env_path}/snapshots/{number}/deploy"
    status, answer = status_and_body(exchange(
        fleet.server, request_head("POST", path), [b"0\r\n\r\n"], token=fleet.api.token))
    assert status == 400, answer
    assert not Deployment.objects.filter(kind="push").exists()


def test_a_chunked_patch_enabled_false_disables_the_agent(fleet_of_two):
    fleet, _, agents = fleet_of_two
    body = b'{"enabled": false}'
    status, answer = status_and_body(exchange(
        fleet.server, request_head("PATCH", f"/api/v1/agents/{agents[1].agent.pk}"),
        chunked(body, 4), token=fleet.api.token))
    assert status == 200 and answer["enabled"] is False, answer
    assert Agent.objects.get(pk=agents[1].agent.pk).enabled is False


CHUNKED_POST = (b"POST /api/v1/agent/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
BROKEN_BODIES = {
    "a size that is not hex": CHUNKED_POST + b"zz\r\nabc\r\n0\r\n\r\n",
    "a negative size": CHUNKED_POST + b"-3\r\nabc\r\n0\r\n\r\n",
    "a size that overflows": CHUNKED_POST + b"f" * 40 + b"\r\nabc\r\n0\r\n\r\n",
    "bare LF line ends": CHUNKED_POST + b"2\n{}\n0\n\n",
    "no CRLF after the data": CHUNKED_POST + b"2\r\n{}XX0\r\n\r\n",
    "a chunk shorter than its size": CHUNKED_POST + b"10\r\n{}",
    "no last chunk": CHUNKED_POST + b"2\r\n{}\r\n",
    "a body shorter than its Content-Length": (
        b"POST /api/v1/agent/enroll HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"name\":"),
}


def half_closed_exchange(server: Server, raw: bytes) -> bytes:
    """Send `raw`, end the sending side, and read the answer until the server closes."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(raw)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while data := sock.recv(65536):
            answer += data
        return answer


@pytest.mark.parametrize("raw", BROKEN_BODIES.values(), ids=BROKEN_BODIES)
def test_a_body_that_breaks_off_is_400_with_the_envelope_never_a_500(bounded_server, raw):
    status, body = status_and_body(half_closed_exchange(bounded_server, raw))
    assert status == 400, body
    # The server's own framing refusals carry no body; the application's the envelope.
    assert body is None or body["error"]["code"] == "parse_error", body


CODED_BODIES = {
    "a transfer coding but chunked": (b"Transfer-Encoding: gzip, chunked\r\n", 400,
                                      "Transfer-Encoding"),
    "a content coding": (b"Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 415,
                         "Content-Encoding"),
}


@pytest.mark.parametrize(("headers", "status", "field"), CODED_BODIES.values(),
                         ids=CODED_BODIES)
def test_a_body_in_a_coding_nothing_decodes_is_refused_naming_the_header(
        bounded_server, headers, status, field):
    head = (b"POST /api/v1/agent/reports HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\n" + headers + b"\r\n")
    answered, body = status_and_body(exchange(bounded_server, head, [b"2\r\n{}\r\n0\r\n\r\n"]))
    assert answered == status, body
    assert [detail["field"] for detail in body["error"]["details"]] == [field]


def head_with(extra: bytes) -> bytes:
    return b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"Connection: close\r\n\r\n"


def test_an_oversized_head_is_431_and_never_delays_other_connections(bounded_server):
    assert status_and_body(exchange(bounded_server, head_with(b"X-Big: " + b"a" * 100_000
                                                              + b"\r\n"), []))[0] == 431
    many = b"".join(b"X-Field-%d: v\r\n" % n for n in range(200))
    assert status_and_body(exchange(bounded_server, head_with(many), []))[0] == 431

    # Forty connections sending a huge header, and forty a body slowly, at once.
    attackers = []
    for index in range(80):
        sock = socket.create_connection(("127.0.0.1", bounded_server.port), timeout=10)
        if index % 2:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * 30_000)
        else:
            sock.sendall(request_head("POST", "/api/v1/agent/enroll", length=1000) + b"{")
        attackers.append(sock)
    try:
        for _ in range(5):
            started = time.monotonic()
            answer = exchange(bounded_server, head_with(b""), [])
            assert status_and_body(answer)[0] == 200
            assert time.monotonic() - started < 0.5
    finally:
        for sock in attackers:
            sock.close()


def test_enrollments_of_nobody_known_are_413_before_they_are_parsed(bounded_server):
    """Ten clients at once sending enrollments of nearly the body limit, five each:
    each is 413 before its body is parsed (an anonymous body is bounded at
    ANONYMOUS_BODY_BYTES). Parsed, these bodies grew the worker by over 100 MB."""
    worker = int(subprocess.run(["pgrep", "-P", str(bounded_server.process.pid)],
                                capture_output=True, text=True).stdout.split()[0])
    body = json.dumps({"enrollment_token": "x", "name": "n" * (LIMIT - 100)}).encode()
    head = request_head("POST", "/api/v1/agent/enroll", length=len(body))
    before = rss_kb(worker)

    def five():
        return [status_and_body(exchange(bounded_server, head, [body]))[0] for _ in range(5)]

    with ThreadPoolExecutor(10) as pool:
        statuses = [s for answers in pool.map(lambda _: five(), range(10)) for s in answers]

    growth = rss_kb(worker) - before
    assert set(statuses) <= {413, 429} and 413 in statuses, statuses
    assert growth < 2 * RSS_GROWTH_MAX_KB, f"RSS grew by {growth} kB"
