"""`python -m agent` given the wrong scheme for its server's port: https:// to a
plain-HTTP server, http:// to a TLS one. It says so, in seconds, instead of a TLS
error or a 30 s timeout."""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import sys
import threading
import time

import pytest

from agent.client import HANDSHAKE_TIMEOUT_S
from agent.runner import EXIT_UNREACHABLE
from tests.agent.support import REPO_ROOT, agent_env
from tests.deployfiles import certificate as made_certificate


class TinyServer:
    """A listening socket on 127.0.0.1 whose connections `serve` handles, each in a
    thread; closed with the test."""

    def __init__(self, serve):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.serve = serve
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(connection,), daemon=True).start()

    def _handle(self, connection):
        with connection, contextlib.suppress(OSError):  # the client may hang up
            self.serve(connection)

    def close(self):
        self.sock.close()


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def answers_at_once(connection):
    """A plain-HTTP server that answers whatever arrives (as most reject a ClientHello)."""
    connection.recv(4096)
    connection.sendall(NOT_FOUND)


def waits_for_the_request(connection):
    """A plain-HTTP server that waits for the end of the request's head, which a TLS
    ClientHello never sends."""
    received = b""
    connection.settimeout(60)
    while b"\r\n\r\n" not in received:
        chunk = connection.recv(4096)
        if not chunk:
            return
        received += chunk
    connection.sendall(NOT_FOUND)


@pytest.fixture
def servers():
    started = []
    yield lambda serve: started.append(TinyServer(serve)) or started[-1]
    for server in started:
        server.close()


def once(host, url) -> tuple:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "agent", "--once", "--server", url, "--target-dir",
         str(host.target), "--state-dir", str(host.state_dir), "--token", "bwa_x.y",
         "--name", "web-1"],
        cwd=REPO_ROOT, env=agent_env(), capture_output=True, text=True, timeout=60)
    return result, time.monotonic() - started


@pytest.mark.parametrize("serve", [answers_at_once, waits_for_the_request])
def test_https_to_a_plain_http_server_says_so_at_once(serve, host, servers):
    server = servers(serve)

    result, took = once(host, f"https://127.0.0.1:{server.port}")

    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    assert (f"the server at 127.0.0.1:{server.port} answered plain HTTP: use "
            f"http://127.0.0.1:{server.port} or put TLS in front of it") in result.stdout
    assert took < HANDSHAKE_TIMEOUT_S + 8  # not the request's 30 s timeout


@pytest.fixture
def certificate(tmp_path) -> tuple:
    return made_certificate(tmp_path)


PLAIN_ON_TLS_PORT = (b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\n"
                     b"Content-Length: 45\r\nConnection: close\r\n\r\n"
                     b"The plain HTTP request was sent to HTTPS port")


@pytest.mark.parametrize("plain_requests", ["are reset", "get a 400 page"])
def test_http_to_a_tls_port_says_so(plain_requests, host, servers, certificate):
    """A TLS port resets a plain request (Python, OpenSSL's s_server) or, as nginx
    does, answers it with a 400 page of its own."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(*certificate)

    def speaks_tls(connection):
        if plain_requests == "get a 400 page" and connection.recv(1, socket.MSG_PEEK) != b"\x16":
            connection.recv(4096)
            connection.sendall(PLAIN_ON_TLS_PORT)
            return
        with context.wrap_socket(connection, server_side=True) as tls:
            tls.recv(4096)
            tls.sendall(NOT_FOUND)

    server = servers(speaks_tls)

    result, took = once(host, f"http://127.0.0.1:{server.port}")

    assert result.returncode == EXIT_UNREACHABLE, result.stderr
    assert (f"the server at 127.0.0.1:{server.port} speaks TLS: use "
            f"https://127.0.0.1:{server.port}") in result.stdout
    assert took < 15
