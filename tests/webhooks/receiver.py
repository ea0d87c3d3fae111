"""A real webhook receiver for the tests: a threaded http.server on 127.0.0.1 (a free
port) that checks each request's signature with the endpoint's secret and answers
from a script (500 first, then 200; a redirect; a slow answer; a large body)."""

import hashlib
import hmac
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.ports import serve_in_thread


@dataclass
class Received:
    path: str
    sequence: int
    event: str
    delivery: str
    body: bytes
    signature_ok: bool
    answered: int


@dataclass
class Receiver:
    secret: str = ""
    # sequence -> statuses to answer its attempts with, in turn (then 200).
    script: dict = field(default_factory=dict)
    redirect: bool = False
    delay_s: float = 0.0
    large_body: bool = False
    received: list = field(default_factory=list)

    def verify(self, headers, body: bytes) -> bool:
        timestamp = headers.get("X-Bellwether-Timestamp", "")
        expected = "sha256=" + hmac.new(self.secret.encode(), f"{timestamp}.".encode() + body,
                                        hashlib.sha256).hexdigest()
        fresh = timestamp.isdigit() and abs(time.time() - int(timestamp)) < 300
        return fresh and hmac.compare_digest(expected,
                                             headers.get("X-Bellwether-Signature", ""))

    def answer(self, sequence: int) -> int:
        if self.redirect:
            return 302
        statuses = self.script.get(sequence, [])
        return statuses.pop(0) if statuses else 200


def _handler(receiver: Receiver):
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            sequence = int(self.headers.get("X-Bellwether-Sequence", 0))
            status = receiver.answer(sequence)
            receiver.received.append(Received(
                self.path, sequence, self.headers.get("X-Bellwether-Event", ""),
                self.headers.get("X-Bellwether-Delivery", ""), body,
                receiver.verify(self.headers, body), status))
            if receiver.delay_s:
                time.sleep(receiver.delay_s)
            payload = b"x" * 100_000 if receiver.large_body else b"ok"
            try:
                self.send_response(status)
                if status == 302:
                    self.send_header("Location", "/elsewhere")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except OSError:
                pass  # the sender gave up (a timeout test)

        def log_message(self, *args):
            pass

    return Handler


def start(receiver: Receiver) -> tuple[ThreadingHTTPServer, str]:
    server = serve_in_thread(_handler(receiver))
    return server, f"http://127.0.0.1:{server.server_address[1]}/hook"
