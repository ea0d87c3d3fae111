"""The agent protocol over HTTP (urllib): enroll, desired, bundle, reports."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
import zlib

from agent import __version__

USER_AGENT = f"bellwether-agent/{__version__}"
# A gzip answer is never inflated beyond this (a bundle is at most a few MiB).
MAX_INFLATED_BYTES = 256 * 1024 * 1024
# A server that timed out is not asked first again for this long: a silent server
# then costs one timeout per this period instead of one per poll.
TIMED_OUT_REST_S = 60.0
# A TLS server answers a ClientHello at once; a plain-HTTP server may wait for the
# end of a request line that never comes. The handshake gets this long, not the
# request's whole timeout, and a probe then says which it was.
HANDSHAKE_TIMEOUT_S = 10.0
# How long a probe of the other scheme (after a failed handshake or exchange) waits.
PROBE_TIMEOUT_S = 3.0
logger = logging.getLogger("agent.client")


class ProtocolError(Exception):
    """The server answered, but not as the protocol says (or with an error)."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status = status
        self.code = code


class Unauthorized(ProtocolError):
    pass


class Unreachable(Exception):
    """No answer: connection refused, timeout, DNS, TLS."""

    def __init__(self, message: str, *, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class _HandshakeFailed(OSError):
    """The TLS handshake failed or timed out (a certificate refused is not this)."""

    def __init__(self, cause: OSError):
        super().__init__(f"TLS handshake: {cause}")
        self.timed_out = isinstance(cause, (socket.timeout, TimeoutError))


class _HTTPSConnection(http.client.HTTPSConnection):
    """http.client's HTTPS connection with the handshake bounded apart."""

    def connect(self):
        http.client.HTTPConnection.connect(self)  # TCP, through a proxy's tunnel if any
        timeout = self.sock.gettimeout()
        self.sock.settimeout(HANDSHAKE_TIMEOUT_S if timeout is None
                             else min(timeout, HANDSHAKE_TIMEOUT_S))
        try:
            self.sock = self._context.wrap_socket(
                self.sock, server_hostname=self._tunnel_host or self.host)
        except ssl.SSLCertVerificationError:
            raise
        except OSError as exc:  # ssl.SSLError, a timeout, a reset
            raise _HandshakeFailed(exc) from exc
        self.sock.settimeout(timeout)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_HTTPSConnection, req, context=self._context)


def _answers_plain_http(host: str, port: int) -> bool:
    """Whether host:port answers a plain HTTP request with an HTTP status line."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock:
            sock.sendall(f"HEAD / HTTP/1.0\r\nHost: {host}\r\n\r\n".encode("ascii", "replace"))
            return sock.recv(5) == b"HTTP/"
    except OSError:
        return False


def _answers_tls(host: str, port: int) -> bool:
    """Whether host:port completes a TLS handshake (its certificate not checked:
    only which protocol it speaks is asked)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S) as sock, \
                context.wrap_socket(sock, server_hostname=host):
            return True
    except (OSError, ValueError):
        return False


def _scheme_mismatch(server: str, exc: BaseException) -> str | None:
    """What to say when `server`'s scheme is not what its port speaks: https:// to a
    plain-HTTP server (the handshake failed or timed out), http:// to a TLS port
    (the connection closed, answered with no HTTP status line, or with a 400 not
    in the API's error envelope); else None."""
    parsed = urllib.parse.urlsplit(server)
    reason = getattr(exc, "reason", exc)
    host = parsed.hostname or ""
    if parsed.scheme == "https" and isinstance(reason, _HandshakeFailed):
        port = parsed.port or 443
        if _answers_plain_http(host, port):
            return (f"{server}: the server at {parsed.netloc} answered plain HTTP: use "
                    f"http://{parsed.netloc} or put TLS in front of it")
    if parsed.scheme == "http" and (isinstance(exc, urllib.error.HTTPError) or isinstance(
            reason, (http.client.BadStatusLine, ConnectionResetError))):
        port = parsed.port or 80
        if _answers_tls(host, port):
            return (f"{server}: the server at {parsed.netloc} speaks TLS: use "
                    f"https://{parsed.netloc}")
    return None


def _timed_out(exc: BaseException) -> bool:
    reason = getattr(exc, "reason", exc)
    return isinstance(reason, (socket.timeout, TimeoutError)) or getattr(reason, "timed_out",
                                                                         False)


def _inflated(server: str, body: bytes) -> bytes:
    """A gzip body inflated, at most MAX_INFLATED_BYTES; anything else is a
    server that did not answer as the protocol says."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        data = inflater.decompress(body, MAX_INFLATED_BYTES)
    except zlib.error as exc:
        raise ProtocolError(200, "bad_response", f"{server}: gzip body: {exc}") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise ProtocolError(200, "bad_response", f"{server}: gzip body truncated or over "
                                                 f"{MAX_INFLATED_BYTES} bytes inflated")
    return data


LONG_POLL_HEADER = "Bellwether-Long-Poll"


def _long_poll_seconds(value) -> int | None:
    """The advertised long-poll maximum: whole seconds above 0, else None."""
    value = (value or "").strip()
    if not value.isdigit() or not value.isascii() or len(value) > 4 or int(value) == 0:
        return None
    return int(value)


class Client:
    """Speaks to the first of `servers` that answers. A request fails over to the
    next server on no answer or a 5xx; each poll (`desired`) starts again from the
    first, so the agent goes back to it as soon as it answers; a server that timed
    out is asked last for TIMED_OUT_REST_S, so a silent first server costs one
    timeout per rest period, not one per poll."""

    def __init__(self, servers, *, token: str | None = None,
                 ca_bundle: str | None = None, timeout: float = 30.0, clock=time.monotonic):
        if isinstance(servers, str):
            servers = [servers]
        self.servers = [s.rstrip("/") for s in servers]
        self.current = 0
        self.token = token
        self.timeout = timeout
        self.context = ssl.create_default_context(cafile=ca_bundle)
        self.opener = urllib.request.build_opener(_HTTPSHandler(context=self.context))
        self.clock = clock
        self.resting_until: dict[int, float] = {}  # server index -> clock time
        # Seconds the server may hold a poll (its Bellwether-Long-Poll header on the
        # last desired answer); None: it does not long-poll, or an error since.
        self.long_poll_s: int | None = None

    @property
    def server(self) -> str:
        return self.servers[self.current]

    def _request(self, method: str, path: str, body: dict | None = None,
                 headers: dict | None = None, *, from_first: bool = False,
                 timeout: float | None = None):
        error = None
        for index in self._order(from_first):
            try:
                answer = self._request_one(self.servers[index], method, path, body, headers,
                                           timeout=timeout)
            except (Unreachable, ProtocolError) as exc:
                if isinstance(exc, ProtocolError) and exc.status < 500:
                    raise
                if isinstance(exc, Unreachable) and exc.timed_out:
                    self.resting_until[index] = self.clock() + TIMED_OUT_REST_S
                error = exc
                if len(self.servers) > 1:
                    logger.warning("%s failed (%s); trying the next server",
                                   self.servers[index], exc)
                continue
            self.resting_until.pop(index, None)
            if index != self.current:
                logger.info("now using %s%s", self.servers[index],
                            " (the first server answers again)" if index == 0 else "")
                self.current = index
            return answer
        raise error

    def _order(self, from_first: bool) -> list:
        """The servers to try, in order: from the first (a poll) or the current one,
        those resting after a timeout last."""
        start = 0 if from_first else self.current
        order = list(range(start, len(self.servers))) + list(range(start))
        now = self.clock()
        resting = [i for i in order if self.resting_until.get(i, 0.0) > now]
        return [i for i in order if i not in resting] + resting

    def _request_one(self, server: str, method: str, path: str, body: dict | None,
                     headers: dict | None, *, timeout: float | None = None):
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(server + path, data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", USER_AGENT)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with self.opener.open(request, timeout=timeout or self.timeout) as response:
                body = response.read()
                if response.headers.get("Content-Encoding", "").lower() == "gzip":
                    body = _inflated(server, body)
                return response.status, response.headers, body
        except urllib.error.HTTPError as exc:
            if exc.code == 304:
                return 304, exc.headers, b""
            raw = exc.read()
            try:
                error = json.loads(raw)["error"]
                code, message = error["code"], error["message"]
            except (ValueError, KeyError, TypeError):
                code, message = "http_error", raw[:200].decode("utf-8", "replace")
                # nginx, Go and others answer plain HTTP on a TLS port with a 400.
                mismatch = _scheme_mismatch(server, exc) if exc.code == 400 else None
                if mismatch:
                    raise Unreachable(mismatch) from None
            cls = Unauthorized if exc.code == 401 else ProtocolError
            raise cls(exc.code, code, message) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            mismatch = _scheme_mismatch(server, exc)
            if mismatch:
                raise Unreachable(mismatch) from None
            raise Unreachable(f"{server}: {getattr(exc, 'reason', exc)!r}",
                              timed_out=_timed_out(exc)) from None

    @staticmethod
    def _json(status: int, body: bytes) -> dict:
        try:
            return json.loads(body)
        except ValueError:
            raise ProtocolError(status, "bad_response",
                                f"not JSON: {body[:80].decode('utf-8', 'replace')!r}") from None

    def enroll(self, enrollment_token: str, name: str, labels: dict) -> dict:
        status, _, body = self._request("POST", "/api/v1/agent/enroll", {
            "enrollment_token": enrollment_token, "name": name, "labels": labels})
        return self._json(status, body)

    def desired(self, etag: str | None, wait: int | None = None):
        """(status, etag, body): status 304 means unchanged since `etag`. With `wait`
        (and `etag`), the server may hold the answer up to `wait` seconds until the
        desired state changes (a long-poll); the request's timeout covers the wait."""
        headers = {"If-None-Match": etag} if etag else {}
        path, timeout = "/api/v1/agent/desired", None
        if wait and etag:
            path, timeout = f"{path}?wait={int(wait)}", self.timeout + wait
        try:
            status, response_headers, body = self._request("GET", path, headers=headers,
                                                           from_first=True, timeout=timeout)
        except (Unreachable, ProtocolError):
            self.long_poll_s = None  # plain polling until a server advertises it again
            raise
        self.long_poll_s = _long_poll_seconds(response_headers.get(LONG_POLL_HEADER))
        if status == 304:
            return 304, etag, None
        # response_headers is an HTTPMessage: header names match case-insensitively.
        return status, response_headers.get("ETag"), self._json(status, body)

    def bundle(self, url: str) -> dict:
        # Bundles are stored gzip-compressed on the server: several times smaller.
        status, _, body = self._request("GET", url, headers={"Accept-Encoding": "gzip"})
        return self._json(status, body)

    def report(self, report: dict) -> dict:
        status, _, body = self._request("POST", "/api/v1/agent/reports", report)
        return self._json(status, body)

    def drift(self, report: dict) -> dict:
        status, _, body = self._request("POST", "/api/v1/agent/drift", report)
        return self._json(status, body)
