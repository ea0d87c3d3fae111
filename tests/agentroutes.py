"""The test clients reach the agents' routes as agents do: through the ASGI
application in front of Django (project/asgi.py's HTTP stack), never through Django's
URLconf, which does not hold them.

`ClientHandler.__call__` (every Django and DRF test client) is wrapped so that a
request to an agent path runs the stack under async_to_sync, its thread hops made
on the test's thread, in the test's transaction; whatever the stack hands on
reaches Django through the original handler."""

import asyncio
import contextlib
import io
import re
from unittest import mock

from asgiref.sync import async_to_sync, sync_to_async
from django.core.handlers.wsgi import WSGIRequest
from django.http import HttpResponse
from django.test.client import ClientHandler

from project.admission import Admission
from project.stack import http_stack

AGENT_PATH = re.compile(r"/api/v1/agent/(desired|reports|snapshots/[^/]*/bundle)")
_django_handler = ClientHandler.__call__


async def _on_the_tests_thread(function, *args, **kwargs):
    return await sync_to_async(function)(*args, **kwargs)


@contextlib.asynccontextmanager
async def _admitted_on_the_tests_thread(admission):
    yield


@contextlib.contextmanager
def thread_hops_on_the_tests_thread():
    """asyncio.to_thread and the threads admission lends run on the test's thread
    (project/admission.py's bound is tests/core/test_admission.py's)."""
    with (mock.patch.object(asyncio, "to_thread", _on_the_tests_thread),
          mock.patch.object(Admission, "admitted", _admitted_on_the_tests_thread)):
        yield


def scope_of(environ) -> dict:
    headers = [(name[5:].lower().replace("_", "-").encode(), str(value).encode("latin-1"))
               for name, value in environ.items() if name.startswith("HTTP_")]
    if "HTTP_HOST" not in environ:  # as the test client's Django reads it
        headers.append((b"host", environ.get("SERVER_NAME", "testserver").encode()))
    for name in ("CONTENT_TYPE", "CONTENT_LENGTH"):
        if environ.get(name):
            headers.append((name.lower().replace("_", "-").encode(),
                            str(environ[name]).encode("latin-1")))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"],
            "raw_path": environ["PATH_INFO"].encode(), "root_path": "",
            "query_string": environ.get("QUERY_STRING", "").encode("latin-1"),
            "scheme": environ.get("wsgi.url_scheme", "http"),
            "client": (environ.get("REMOTE_ADDR", "127.0.0.1"), 50000),
            "server": (environ.get("SERVER_NAME", "testserver"), 80), "headers": headers}


async def received_body(receive) -> bytes:
    """The request's body, all its messages read."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def _django(handler, environ):
    """Django behind the stack: the original test handler, given the body the stack
    hands on."""

    async def app(scope, receive, send):
        body = await received_body(receive)
        handed = {**environ, "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))}
        response = await sync_to_async(_django_handler)(handler, handed)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": [(n.encode(), v.encode("latin-1")) for n, v in response.items()]})
        await send({"type": "http.response.body", "body": response.content})
    return app


async def asgi_answer(app, scope, body: bytes = b"") -> tuple[dict, bytes]:
    """(the start message, the body) of `app`'s answer to a request sending `body`."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    messages = []

    async def receive():
        return pending.pop() if pending else {"type": "http.disconnect"}

    async def send(message):
        messages.append(message)

    await app(scope, receive, send)
    return messages[0], b"".join(m.get("body", b"") for m in messages[1:])


def _answered(app, scope, body: bytes) -> tuple[dict, bytes]:
    """asgi_answer, its thread hops on the test's thread."""
    with thread_hops_on_the_tests_thread():
        return async_to_sync(asgi_answer)(app, scope, body)


def through_the_stack(handler, environ) -> HttpResponse:
    body = environ["wsgi.input"].read()
    start, content = _answered(http_stack(_django(handler, environ)), scope_of(environ), body)
    response = HttpResponse(content, status=start["status"])
    del response["Content-Type"]
    for name, value in start["headers"]:
        response[name.decode("latin-1")] = value.decode("latin-1")
    response.wsgi_request = WSGIRequest({**environ, "wsgi.input": io.BytesIO(body)})
    return response


# Extra environ of a test client's request for Django itself, not the stack in front.
DJANGO_ITSELF = {"bellwether.django_itself": True}


def handled(handler, environ):
    if AGENT_PATH.fullmatch(environ["PATH_INFO"]) and not environ.get(
            "bellwether.django_itself"):
        return through_the_stack(handler, environ)
    return _django_handler(handler, environ)


def install() -> None:
    ClientHandler.__call__ = handled


HANDED_ON = 599  # what `handed_on` answers: the stack handed the request to Django


async def handed_on(scope, receive, send):
    await send({"type": "http.response.start", "status": HANDED_ON, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def stack_answer(scope, *, django=handed_on,
                 body: bytes = b"") -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body) of the HTTP stack's answer to `scope`, Django being
    `django` (by default an application answering HANDED_ON)."""
    start, content = _answered(http_stack(django), scope, body)
    return (start["status"],
            {n.decode().lower(): v.decode("latin-1") for n, v in start["headers"]}, content)
