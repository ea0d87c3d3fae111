"""A small JSON client for the operator REST API (standard library HTTP: the CLI
needs nothing an HTTP library adds beyond timeouts, which urllib has).

A call never follows a redirect (the token would go along to wherever it points),
takes at most the profile's timeout_s in all (not per socket read: a server that
drips one byte a second is cut off), and reads at most MAX_ANSWER_BYTES."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

from cli.config import Profile, redacted_url
from cli.errors import Refused, Unreachable

USER_AGENT = "bellwether-cli/0.1"
NOT_JSON_SHOWN = 200
MAX_ANSWER_BYTES = 64 * 1024 * 1024
READ_CHUNK = 64 * 1024


class Client:
    """One server and token; every call answers the decoded JSON body or raises
    Refused (the server's error envelope, or a redirect) or Unreachable (no
    complete answer in time)."""

    def __init__(self, profile: Profile):
        self.profile = profile

    def get(self, path: str, **query) -> object:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: object = None, **query) -> object:
        return self.call("POST", path, body=body, query=query)

    def post_raw(self, path: str, data: bytes, content_type: str, **query) -> object:
        return self.call("POST", path, data=data, content_type=content_type, query=query)

    def call(self, method: str, path: str, *, body: object = None, data: bytes | None = None,
             content_type: str = "application/json", query: dict | None = None) -> object:
        if body is not None:
            data = json.dumps(body).encode()
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.profile.url + path + (f"?{urlencode(query)}" if query else "")
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", USER_AGENT)
        # Unredirected: never copied onto another request, should one ever be made.
        request.add_unredirected_header("Authorization", f"Bearer {self.profile.token}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        status, location, raw = self._send(request, method, path)
        if 300 <= status < 400:
            raise redirect_refusal(status, location, method, path)
        decoded = _decoded(raw)
        if status >= 400:
            raise _refusal(status, decoded, raw, method, path)
        return decoded

    def _send(self, request, method: str, path: str) -> tuple[int, str | None, bytes]:
        """(status, Location, body) within the profile's timeout_s in all."""
        timeout_s = self.profile.timeout_s
        with CallDeadline(timeout_s) as deadline:
            try:
                return answer_read(request, deadline, timeout_s)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if deadline.passed():
                    raise Unreachable(f"{method} {path}: no complete answer from "
                                      f"{self.profile.url} within {timeout_s:g} s (the "
                                      "profile's timeout_s, for the whole call)") from None
                raise unreachable(exc, f"{method} {path}", self.profile.url) from None


class CallDeadline:
    """The end of one call: when it passes, the call's sockets are shut down, so a
    read blocked on a slow server returns at once (a socket still connecting is
    shut down as soon as it is connected)."""

    def __init__(self, seconds: float):
        self.at = time.monotonic() + seconds
        self.sockets: list = []
        self.expired = False
        self.lock = threading.Lock()
        self.timer = threading.Timer(seconds, self._expire)
        self.timer.daemon = True

    def __enter__(self) -> CallDeadline:
        self.timer.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.timer.cancel()

    def passed(self) -> bool:
        return self.expired or time.monotonic() >= self.at

    def connected(self, sock) -> None:
        with self.lock:
            self.sockets.append(sock)
            if self.expired:
                _shut(sock)

    def _expire(self) -> None:
        with self.lock:
            self.expired = True
            for sock in self.sockets:
                _shut(sock)


def _shut(sock) -> None:
    with contextlib.suppress(OSError, ValueError):
        sock.shutdown(socket.SHUT_RDWR)


class _Watched:
    """An HTTP(S) handler telling its CallDeadline each socket it connects (urllib
    lets go of the connection's socket once the headers are in, so it is kept
    here)."""

    def __init__(self, deadline: CallDeadline, **options):
        super().__init__(**options)
        self.deadline = deadline

    def do_open(self, http_class, request, **options):
        deadline = self.deadline

        def connection(*args, **kwargs):
            opened = http_class(*args, **kwargs)
            connect, create = opened.connect, getattr(opened, "_create_connection", None)

            def create_watched(*args, **kwargs):  # the TCP socket, before any TLS handshake
                sock = create(*args, **kwargs)
                deadline.connected(sock)
                return sock

            def connect_watched():
                try:
                    connect()
                finally:
                    if opened.sock is not None:
                        deadline.connected(opened.sock)
            opened.connect = connect_watched
            if create is not None:
                opened._create_connection = create_watched
            return opened
        return super().do_open(connection, request, **options)


class _WatchedHTTP(_Watched, urllib.request.HTTPHandler):
    pass


class _WatchedHTTPS(_Watched, urllib.request.HTTPSHandler):
    pass


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A redirect is answered as it came (the call refuses it), never followed."""

    def redirect_request(self, *args, **kwargs):
        return None


def answer_read(request, deadline: CallDeadline, timeout_s: float) -> tuple[int, str | None, bytes]:
    opener = urllib.request.build_opener(_NoRedirects, _WatchedHTTP(deadline),
                                         _WatchedHTTPS(deadline))
    try:
        response = opener.open(request, timeout=timeout_s)
    except urllib.error.HTTPError as exc:  # 3xx, 4xx, 5xx: their body is the answer
        response = exc
    with response:
        return (response.getcode(), response.headers.get("Location"),
                body_read(response, deadline))


def body_read(response, deadline: CallDeadline) -> bytes:
    """The body in chunks, at most MAX_ANSWER_BYTES, checking the deadline."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise answer_too_large(response)
    chunks, size = [], 0
    while chunk := response.read(READ_CHUNK):
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise answer_too_large(response)
        if deadline.passed():
            raise TimeoutError
        chunks.append(chunk)
    return b"".join(chunks)


def answer_too_large(response) -> Unreachable:
    return Unreachable(f"the answer from {redacted_url(response.geturl())} is larger than "
                       f"{MAX_ANSWER_BYTES // (1024 * 1024)} MiB: not read")


def unreachable(exc: Exception, request: str, url: str) -> Unreachable:
    """Why no answer came, in words (never the URL's credentials: it holds none)."""
    if isinstance(exc, TimeoutError):
        return Unreachable(f"{request}: no answer from {url} (timed out)")
    if isinstance(exc, ssl.SSLError):
        return Unreachable(f"{request}: TLS with {url} failed: {exc.reason or exc}")
    if isinstance(exc, urllib.error.URLError):
        reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
        return Unreachable(f"{request}: cannot reach {url}: {reason or exc.reason}")
    if isinstance(exc, http.client.HTTPException | ValueError):
        return Unreachable(f"{request}: {url} did not answer in HTTP: "
                           f"{type(exc).__name__} {str(exc)[:NOT_JSON_SHOWN]}")
    return Unreachable(f"{request}: the connection to {url} failed: {exc}")


def redirect_refusal(status: int, location: str | None, method: str, path: str) -> Refused:
    where = redacted_url(location) if location else "(no Location)"
    return Refused(status, "redirect", f"the server answered {status} redirecting to {where}; "
                   "the CLI does not follow redirects (the token would go along): set the "
                   "server URL to where the API answers", method=method, path=path)


def _decoded(raw: bytes) -> object:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _refusal(status: int, decoded: object, raw: bytes, method: str, path: str) -> Refused:
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return Refused(status, error["code"], str(error.get("message", "")),
                       error.get("details"), method=method, path=path)
    text = raw.decode("utf-8", "replace").strip()[:NOT_JSON_SHOWN]
    return Refused(status, f"http_{status}", f"the server answered {status} without its "
                   f"error envelope: {text or '(empty)'}", method=method, path=path)
