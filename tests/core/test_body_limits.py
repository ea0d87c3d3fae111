"""The ASGI and WSGI wrappers of project/bodylimits.py, called directly: bodies over
the limit are refused while they are received, and a chunked body reaches Django
with its length."""

import io

import pytest
from asgiref.sync import async_to_sync

from project.bodylimits import BoundedBodyASGI, BoundedBodyWSGI

LIMIT = 1000


@pytest.fixture(autouse=True)
def _small_limit(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = LIMIT


def scope(headers):
    return {"type": "http", "method": "POST", "path": "/", "headers": headers}


class Recorder:
    """An ASGI app that reads the whole body and remembers what it got."""

    def __init__(self):
        self.body = None
        self.headers = None

    async def __call__(self, scope, receive, send):
        self.headers = dict(scope["headers"])
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.body = body
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run(app, headers, chunks):
    """Drive `app` with body `chunks`; return (status, bytes asked for from the client)."""
    sent, pulled = [], []
    pending = list(chunks)

    async def receive():
        chunk = pending.pop(0)
        pulled.append(len(chunk))
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message):
        sent.append(message)

    async def go():
        await app(scope(headers), receive, send)

    async_to_sync(go)()
    return sent[0]["status"], sum(pulled), sent


def test_asgi_refuses_a_declared_length_over_the_limit_without_reading_the_body():
    app = Recorder()
    status, pulled, sent = run(BoundedBodyASGI(app), [(b"content-length", b"5000")],
                               [b"x" * 500] * 10)
    assert (status, pulled, app.body) == (413, 0, None)
    assert b'"too_large"' in sent[1]["body"]


def test_asgi_refuses_a_chunked_body_as_soon_as_it_passes_the_limit():
    app = Recorder()
    status, pulled, _ = run(BoundedBodyASGI(app), [(b"transfer-encoding", b"chunked")],
                            [b"x" * 400] * 100)
    assert status == 413
    assert pulled <= LIMIT + 400
    assert app.body is None


def test_asgi_gives_a_chunked_body_its_length():
    app = Recorder()
    status, _, _ = run(BoundedBodyASGI(app), [(b"transfer-encoding", b"chunked")],
                       [b'{"agents":', b" [1]}"])
    assert status == 200
    assert app.body == b'{"agents": [1]}'
    assert app.headers[b"content-length"] == b"15"
    assert b"transfer-encoding" not in app.headers


def test_asgi_refuses_a_body_longer_than_it_declared_once_over_the_limit():
    app = Recorder()
    status, _, _ = run(BoundedBodyASGI(app), [(b"content-length", b"10")], [b"x" * 600] * 3)
    assert status == 413


@pytest.mark.parametrize("value", [b"abc", b"-1", b"1, 2", b"\xd9\xa1"])
def test_asgi_refuses_a_malformed_content_length(value):
    status, _, _ = run(BoundedBodyASGI(Recorder()), [(b"content-length", value)], [b""])
    assert status == 400


def wsgi_call(environ):
    seen = {}

    def app(environ, start_response):
        seen["length"] = environ.get("CONTENT_LENGTH")
        seen["body"] = environ["wsgi.input"].read()
        start_response("200 OK", [])
        return [b"ok"]

    statuses = []
    BoundedBodyWSGI(app)(environ, lambda status, headers: statuses.append(status))
    return statuses[0], seen


def test_wsgi_refuses_a_declared_length_over_the_limit():
    status, seen = wsgi_call({"CONTENT_LENGTH": "5000", "wsgi.input": io.BytesIO(b"x" * 5000)})
    assert status.startswith("413") and seen == {}


def test_wsgi_reads_a_chunked_body_the_server_delimits_and_gives_it_its_length():
    status, seen = wsgi_call({"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True,
                              "wsgi.input": io.BytesIO(b'{"enabled": false}')})
    assert status.startswith("200")
    assert seen == {"length": "18", "body": b'{"enabled": false}'}


def test_wsgi_refuses_an_oversized_chunked_body():
    status, seen = wsgi_call({"HTTP_TRANSFER_ENCODING": "chunked", "wsgi.input_terminated": True,
                              "wsgi.input": io.BytesIO(b"x" * 5000)})
    assert status.startswith("413") and seen == {}


def test_wsgi_refuses_a_chunked_body_it_cannot_delimit_with_411():
    status, seen = wsgi_call({"HTTP_TRANSFER_ENCODING": "chunked",
                              "wsgi.input": io.BytesIO(b"5\r\nhello\r\n0\r\n\r\n")})
    assert status.startswith("411") and seen == {}
