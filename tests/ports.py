"""Ports for the servers tests start. With BELLWETHER_TEST_PORTS set ("18100-18199"),
only that range is used, so test runs sharing a machine keep apart (each pytest-xdist
worker takes its own share of it); otherwise any free port the kernel gives."""

from __future__ import annotations

import os
import socket
import threading
from http.server import ThreadingHTTPServer

from tests.workers import worker_share

RANGE_VARIABLE = "BELLWETHER_TEST_PORTS"


def _range() -> range | None:
    spec = os.environ.get(RANGE_VARIABLE, "").strip()
    if not spec:
        return None
    low, _, high = spec.partition("-")
    try:
        first, last = int(low), int(high or low)
    except ValueError:
        raise RuntimeError(f"{RANGE_VARIABLE}={spec!r}: give FIRST-LAST, e.g. "
                           "18100-18199") from None
    return worker_share(range(first, last + 1))


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on now."""
    ports = _range()
    if ports is None:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            return sock.getsockname()[1]
    # Start at a different place each call, so ports just released are not reused at once.
    start = int.from_bytes(os.urandom(2), "big") % len(ports)
    for offset in range(len(ports)):
        port = ports[(start + offset) % len(ports)]
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {RANGE_VARIABLE}={os.environ[RANGE_VARIABLE]}")


def serve_in_thread(handler, port: int | None = None) -> ThreadingHTTPServer:
    """A ThreadingHTTPServer on 127.0.0.1 (`port`, or a free one) answering with `handler`, in a
    daemon thread; `server.shutdown()` stops it within a twentieth of a second (the
    standard library's default poll of half a second cost each test that much)."""
    server = ThreadingHTTPServer(("127.0.0.1", port or free_port()), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                     daemon=True).start()
    return server
