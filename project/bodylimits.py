"""A request's body received whole, bounded, before the application runs.

Refused with the error envelope: 413 once it passes `DATA_UPLOAD_MAX_MEMORY_SIZE`,
408 when it has not arrived within `BELLWETHER_BODY_RECEIVE_S`, 400 when it breaks
off (a malformed chunk, a short body: else Django stops without an answer and the
server sends its own 500), 400/415 for a coding nothing here decodes. Received
before the request waits for Django (project.admission), a slow sender holds no
place there. A chunked body is handed on with its Content-Length.
"""

import asyncio
import json
import tempfile

from django.conf import settings


def body_limit() -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def envelope(code: str, message: str, field: str | None = None) -> bytes:
    """The API's error envelope (apps.core.errors) for an answer made before Django,
    naming the header at fault when there is one."""
    error = {"code": code, "message": f"{field}: {message}" if field else message}
    if field:
        error["details"] = [{"field": field, "message": message}]
    return json.dumps({"error": error}).encode()


def too_large_body() -> bytes:
    return envelope("too_large", f"Request body is over {body_limit()} bytes.")


def declared_length(value: bytes | str | None) -> int | None:
    """The Content-Length as a number; None when absent; -1 when malformed."""
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    parts = {part.strip() for part in text.split(",")}
    if len(parts) != 1 or not all(part.isdigit() and part.isascii() for part in parts):
        return -1
    return int(parts.pop())


def refused_coding(headers) -> tuple[int, bytes] | None:
    """(status, envelope) for a body in a coding nothing here decodes: a transfer
    coding other than chunked (400: the server would pass it on undecoded) or a
    content coding other than identity (415); None when the body is plain."""
    for name, value in headers:
        name, value = name.lower(), value.decode("latin-1").strip().lower()
        if name == b"transfer-encoding" and value != "chunked":
            return 400, envelope("invalid", "only chunked is accepted", "Transfer-Encoding")
        if name == b"content-encoding" and value not in ("", "identity"):
            return 415, envelope("unsupported_media_type", "bodies are accepted uncompressed",
                                 "Content-Encoding")
    return None


# --- ASGI ----------------------------------------------------------------------

SPOOL_BYTES = 256 * 1024
CHUNK_BYTES = 64 * 1024


class RefusedBody(Exception):
    """The body passed the limit, or broke off, while it was received."""

    def __init__(self, status: int, body: bytes):
        self.status, self.body = status, body


async def send_json(send, status: int, body: bytes, *headers) -> None:
    """Send an answer made before Django: `body` (JSON) with `headers`."""
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
        *headers]})
    await send({"type": "http.response.body", "body": body})


async def _refuse(send, status: int, body: bytes) -> None:
    """The body is not read: the connection closes after the answer."""
    await send_json(send, status, body, (b"connection", b"close"))


async def _received(receive, spool, limit: int) -> None:
    """Receive the whole body into `spool`."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise RefusedBody(400, envelope(
                "parse_error", "The request body is malformed or incomplete."))
        spool.write(message.get("body", b""))
        if spool.tell() > limit:
            raise RefusedBody(413, too_large_body())
        if not message.get("more_body", False):
            return


def _replay(spool, receive):
    """An ASGI receive giving the spooled body in chunks, then the client's own
    (a disconnect, for whoever listens for one)."""
    remaining = spool.tell()
    spool.seek(0)
    given = False

    async def replayed():
        nonlocal remaining, given
        if given:
            return await receive()
        chunk = spool.read(min(CHUNK_BYTES, remaining))
        remaining -= len(chunk)
        given = remaining == 0
        return {"type": "http.request", "body": chunk, "more_body": not given}
    return replayed


class BoundedBodyASGI:
    """Wraps the HTTP application: receives each request's body whole (bounded in
    size and time, refused when it breaks off) and hands it on with its length."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit()
        headers = scope.get("headers") or []
        refused = refused_coding(headers)
        if refused is not None:
            return await _refuse(send, *refused)
        length = declared_length(dict(headers).get(b"content-length"))
        if length == -1:
            return await _refuse(send, 400, envelope("parse_error", "not a single whole number",
                                                     "Content-Length"))
        if length is not None and length > limit:
            return await _refuse(send, 413, too_large_body())
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES) as spool:
            try:
                await asyncio.wait_for(_received(receive, spool, limit),
                                       settings.BELLWETHER_BODY_RECEIVE_S)
            except TimeoutError:
                return await _refuse(send, 408, envelope(
                    "request_timeout", "The request body did not arrive in time."))
            except RefusedBody as refused:
                return await _refuse(send, refused.status, refused.body)
            if length is None and spool.tell():
                scope = {**scope, "headers": [
                    *[(n, v) for n, v in scope["headers"] if n != b"transfer-encoding"],
                    (b"content-length", str(spool.tell()).encode())]}
            return await self.app(scope, _replay(spool, receive), send)
