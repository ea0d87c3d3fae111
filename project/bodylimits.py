"""Request bodies bounded while they are read, in every server we ship.

Three layers, each refusing with `413` and the error envelope as soon as a body
passes `DATA_UPLOAD_MAX_MEMORY_SIZE` (`BELLWETHER_MAX_REQUEST_BYTES`), before more
is buffered:

- `BoundedWebRequest`: Daphne (`runserver`, and `daphne` if a deployment runs
  it). Twisted receives the whole body before Daphne starts the application, so
  only the Twisted request can count bytes as they arrive; it answers 413 and
  closes the connection.
- `BoundedBodyASGI`: any ASGI server (granian in production, which hands the body
  on as it arrives). Counts `http.request` bytes, and gives a body sent without
  `Content-Length` (chunked) its length, so Django and DRF read it instead of
  taking it for empty.
- `BoundedBodyWSGI`: the same for WSGI servers (`project/wsgi.py`); a chunked body
  the server cannot delimit (`wsgi.input_terminated` unset) is refused with `411`.
"""

import io
import json

from django.conf import settings

# How long a refused connection keeps discarding what the client still sends, so
# the client reads the 413 instead of a connection reset.
LINGER_S = 2.0


def body_limit() -> int:
    return settings.DATA_UPLOAD_MAX_MEMORY_SIZE


def envelope(code: str, message: str) -> bytes:
    """The API's error envelope (apps.core.errors) for an answer made before Django."""
    return json.dumps({"error": {"code": code, "message": message}}).encode()


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


# --- ASGI ----------------------------------------------------------------------

class BodyTooLarge(Exception):
    """The body passed the limit while the application was receiving it."""


async def _answer(send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class BoundedBodyASGI:
    """Wraps the HTTP application: bodies over the limit get 413 while being
    received; a body without Content-Length is received (bounded) and handed on
    with its length."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = body_limit()
        headers = dict(scope.get("headers") or [])
        length = declared_length(headers.get(b"content-length"))
        if length == -1:
            return await _answer(send, 400, envelope("parse_error", "Bad Content-Length."))
        if length is not None and length > limit:
            return await _answer(send, 413, too_large_body())
        if length is None:
            return await self._without_length(scope, receive, send, limit)
        received = 0

        async def counted():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > limit:
                raise BodyTooLarge
            return message

        try:
            return await self.app(scope, counted, send)
        except BodyTooLarge:
            return await _answer(send, 413, too_large_body())

    async def _without_length(self, scope, receive, send, limit):
        body = bytearray()
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, _replay([message]), send)
            body += message.get("body", b"")
            if len(body) > limit:
                return await _answer(send, 413, too_large_body())
            if not message.get("more_body", False):
                break
        if body:
            scope = {**scope, "headers": [
                *[(n, v) for n, v in scope["headers"] if n != b"transfer-encoding"],
                (b"content-length", str(len(body)).encode())]}
        return await self.app(scope, _replay([
            {"type": "http.request", "body": bytes(body), "more_body": False}], receive), send)


def _replay(messages, then=None):
    pending = list(messages)

    async def receive():
        if pending:
            return pending.pop(0)
        if then is not None:
            return await then()
        return {"type": "http.disconnect"}
    return receive


# --- WSGI ----------------------------------------------------------------------

class BoundedBodyWSGI:
    def __init__(self, app):
        self.app = app

    def __call__(self, environ, start_response):
        limit = body_limit()
        length = declared_length(environ.get("CONTENT_LENGTH") or None)
        chunked = "chunked" in environ.get("HTTP_TRANSFER_ENCODING", "").lower()
        if length == -1:
            return _wsgi_answer(start_response, "400 Bad Request",
                                envelope("parse_error", "Bad Content-Length."))
        if length is not None and length > limit:
            return _wsgi_answer(start_response, "413 Content Too Large", too_large_body())
        if length is None and chunked:
            if not environ.get("wsgi.input_terminated"):
                return _wsgi_answer(start_response, "411 Length Required", envelope(
                    "length_required", "Send the body with a Content-Length."))
            body = environ["wsgi.input"].read(limit + 1)
            if len(body) > limit:
                return _wsgi_answer(start_response, "413 Content Too Large", too_large_body())
            environ = {**environ, "wsgi.input": io.BytesIO(body),
                       "CONTENT_LENGTH": str(len(body))}
        return self.app(environ, start_response)


def _wsgi_answer(start_response, status: str, body: bytes):
    start_response(status, [("Content-Type", "application/json"),
                            ("Content-Length", str(len(body))), ("Connection", "close")])
    return [body]
