"""The ASGI and WSGI wrappers of project/bodylimits.py, called directly: bodies over
the limit are refused while they are received, one that breaks off or arrives too
slowly is refused before the application runs, and a chunked body reaches Django
with its length."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync

from project.admission import DjangoAdmission
from project.bodylimits import BoundedBodyASGI
from tests.agentroutes import received_body

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
        self.body = await received_body(receive)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def run(app, headers, chunks, then_leave=False):
    """Drive `app` with body `chunks` (then, with `then_leave`, the client leaving);
    return (status, bytes asked for from the client, what was sent)."""
    sent, pulled = [], []
    pending = list(chunks)

    async def receive():
        if not pending:
            return {"type": "http.disconnect"}
        chunk = pending.pop(0)
        pulled.append(len(chunk))
        return {"type": "http.request", "body": chunk,
                "more_body": bool(pending) or then_leave}

    async def send(message):
        sent.append(message)

    async def go():
        await app(scope(headers), receive, send)

    async_to_sync(go)()
    return sent[0]["status"] if sent else None, sum(pulled), sent


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


@pytest.mark.parametrize("framing", [[(b"content-length", b"100")],
                                     [(b"transfer-encoding", b"chunked")]])
def test_asgi_answers_a_body_that_breaks_off_400_and_never_runs_the_app(framing):
    """A malformed chunk or a body shorter than its length: the server reports a
    disconnect in the middle of the body."""
    app = Recorder()
    status, _, sent = run(BoundedBodyASGI(app), framing, [b'{"a":'], then_leave=True)
    assert status == 400 and app.body is None
    assert json.loads(sent[1]["body"])["error"]["code"] == "parse_error"


def test_asgi_hands_on_a_body_whole_in_memory_or_spooled_to_disk(settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1_000_000
    big = [bytes([i % 251]) * 100_000 for i in range(5)]  # 500 kB: past the spool size
    for chunks in ([b""], [b"a", b"bc", b"def"], big):
        for framing in ([(b"content-length", str(len(b"".join(chunks))).encode())],
                        [(b"transfer-encoding", b"chunked")]):
            app = Recorder()
            status, _, _ = run(BoundedBodyASGI(app), framing, chunks)
            assert (status, app.body) == (200, b"".join(chunks))


class Echo:
    """Answers with the body it received; counts how many run at once."""

    def __init__(self):
        self.inside = self.most = 0

    async def __call__(self, scope, receive, send):
        self.inside += 1
        self.most = max(self.most, self.inside)
        body = await received_body(receive)
        await asyncio.sleep(0.05)
        self.inside -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": body})


def _sending(chunks, delay_s: float):
    """A client's receive: the body in `chunks`, `delay_s` before each."""
    pending = list(chunks)

    async def receive():
        await asyncio.sleep(delay_s)
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
    return receive


async def _post(app, receive):
    sent = []

    async def send(message):
        sent.append(message)
    await app(scope([(b"transfer-encoding", b"chunked")]), receive, send)
    return sent


@pytest.mark.slow
def test_slow_bodies_hold_no_place_in_django_and_are_408_after_the_deadline(settings):
    settings.BELLWETHER_BODY_RECEIVE_S = 1
    settings.BELLWETHER_DJANGO_CONCURRENCY = 1
    inner = Echo()
    app = BoundedBodyASGI(DjangoAdmission(inner))

    async def scene():
        slow = [asyncio.create_task(_post(app, _sending([b"x"] * 100, delay_s=0.5)))
                for _ in range(3)]  # more slow clients than Django's places
        await asyncio.sleep(0.2)
        quick = await asyncio.wait_for(_post(app, _sending([b"ok"], 0)), 2)
        return quick, await asyncio.gather(*slow)

    quick, slow = async_to_sync(scene)()
    assert (quick[0]["status"], quick[1]["body"]) == (200, b"ok")
    assert {answer[0]["status"] for answer in slow} == {408}
    assert json.loads(slow[0][1]["body"])["error"]["code"] == "request_timeout"
    assert inner.most == 1  # the slow ones never entered
