"""project/admission.py called directly: at most BELLWETHER_DJANGO_CONCURRENCY
requests inside Django at once, the rest queued on the loop, a request queued past
BELLWETHER_DJANGO_QUEUE_S answered 503 with the envelope, and the admitted ones run
on as many lent threads, each keeping its database wrapper."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import ThreadSensitiveContext, async_to_sync, sync_to_async

from project.admission import DjangoAdmission


@pytest.fixture(autouse=True)
def _small_gate(settings):
    settings.BELLWETHER_DJANGO_CONCURRENCY = 2
    settings.BELLWETHER_DJANGO_QUEUE_S = 1


class Slow:
    """An application taking `seconds` per request; counts how many run at once."""

    def __init__(self, seconds):
        self.seconds, self.inside, self.most = seconds, 0, 0

    async def __call__(self, scope, receive, send):
        self.inside += 1
        self.most = max(self.most, self.inside)
        await asyncio.sleep(self.seconds)
        self.inside -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _no_body():
    return {"type": "http.request", "body": b"", "more_body": False}


def _staying_client():
    """A client's receive: no body, then never leaving (Django listens for it)."""
    asked = []

    async def receive():
        if asked:
            await asyncio.sleep(3600)
        asked.append(True)
        return await _no_body()
    return receive


def _calls(app, paths, kind="http"):
    async def one(path):
        sent = []
        async def send(message):
            sent.append(message)
        await app({"type": kind, "path": path, "headers": []}, _no_body, send)
        return sent
    async def all_of_them():
        return await asyncio.gather(*(one(path) for path in paths))
    return async_to_sync(all_of_them)()


def test_requests_beyond_the_limit_wait_their_turn_and_are_answered():
    inner = Slow(0.1)

    answers = _calls(DjangoAdmission(inner), ["/api/v1/agent/reports"] * 6)

    assert [a[0]["status"] for a in answers] == [200] * 6
    assert inner.most == 2


@pytest.mark.slow
def test_a_request_queued_past_the_limit_is_503_with_the_envelope():
    inner = Slow(1.5)

    answers = _calls(DjangoAdmission(inner), ["/api/v1/agent/desired"] * 3)

    statuses = sorted(a[0]["status"] for a in answers)
    assert statuses == [200, 200, 503]
    busy = next(a for a in answers if a[0]["status"] == 503)
    assert (b"retry-after", b"5") in busy[0]["headers"]
    assert json.loads(busy[1]["body"])["error"]["code"] == "unavailable"


def test_liveness_readiness_and_websockets_are_never_queued():
    inner = Slow(0.3)

    answers = _calls(DjangoAdmission(inner),
                     ["/healthz"] * 4 + ["/readyz"] * 2 + ["/static/x.css"] * 2)
    assert [a[0]["status"] for a in answers] == [200] * 8
    assert inner.most == 8

    inner = Slow(0.1)
    _calls(DjangoAdmission(inner), ["/ws/events"] * 4, kind="websocket")
    assert inner.most == 4


async def _call(app, receive):
    sent = []

    async def send(message):
        sent.append(message)
    await app({"type": "http", "path": "/api/v1/agent/reports", "headers": []}, receive, send)
    return sent


class DjangoLike:
    """Runs its synchronous part as Django's ASGI handler does: inside a
    ThreadSensitiveContext of its own, through thread-sensitive sync_to_async.
    Records the thread of each request's two sync calls."""

    def __init__(self, fail_on: str = ""):
        self.threads: list[tuple[str, str]] = []
        self.fail_on = fail_on

    async def __call__(self, scope, receive, send):
        async with ThreadSensitiveContext():
            first = await sync_to_async(lambda: threading.current_thread().name)()
            await asyncio.sleep(0.01)
            second = await sync_to_async(lambda: threading.current_thread().name)()
        self.threads.append((first, second))
        if scope["path"] == self.fail_on:
            raise RuntimeError("the view failed")
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def test_admitted_requests_run_on_a_fixed_set_of_lent_threads():
    inner = DjangoLike()
    admission = DjangoAdmission(inner)

    async def twice():  # two bursts on one loop: the second reuses the first's threads
        first = await asyncio.gather(*(_call(admission, _no_body) for _ in range(10)))
        second = await asyncio.gather(*(_call(admission, _no_body) for _ in range(10)))
        return first + second
    answers = async_to_sync(twice)()

    assert [a[0]["status"] for a in answers] == [200] * 20
    assert all(first == second for first, second in inner.threads)  # one thread a request
    names = {first for first, _ in inner.threads}
    assert len(names) == 2  # BELLWETHER_DJANGO_CONCURRENCY, not one per request
    assert all(name.startswith("django-request") for name in names)


def test_a_request_that_fails_gives_its_thread_back():
    inner = DjangoLike(fail_on="/api/v1/agent/boom")
    admission = DjangoAdmission(inner)

    async def scene():
        failed = []
        async def send(message):
            pass
        for _ in range(3):  # more failures than threads
            try:
                await admission({"type": "http", "path": "/api/v1/agent/boom", "headers": []},
                                _no_body, send)
            except RuntimeError:
                failed.append(True)
        answered = await asyncio.wait_for(
            asyncio.gather(*(_call(admission, _no_body) for _ in range(4))), 5)
        return failed, answered
    failed, answered = async_to_sync(scene)()

    assert failed == [True] * 3
    assert [a[0]["status"] for a in answered] == [200] * 4
    assert len({first for first, _ in inner.threads}) <= 2


@pytest.mark.django_db(transaction=True)
def test_django_keeps_one_database_wrapper_per_lent_thread():
    """Django's own ASGI handler with the ORM: every request's connection is one of
    BELLWETHER_DJANGO_CONCURRENCY wrappers, where Django alone makes one a request."""
    from django.core.asgi import get_asgi_application
    from django.core.signals import request_finished
    from django.db import connections

    from tests import factories

    _, secret = factories.api_token(factories.superuser())
    seen = []

    def record(**kwargs):
        seen.append((threading.current_thread().name, id(connections["default"])))
    request_finished.connect(record)
    admission = DjangoAdmission(get_asgi_application())
    headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {secret}".encode())]

    async def one():
        sent = []

        async def send(message):
            sent.append(message)
        await admission({"type": "http", "method": "GET", "path": "/api/v1/environments",
                         "query_string": b"", "headers": headers, "scheme": "http",
                         "server": ("testserver", 80), "client": ("127.0.0.1", 1)},
                        _staying_client(), send)
        return sent[0]["status"]
    async def eight():
        return await asyncio.gather(*(one() for _ in range(8)))
    try:
        statuses = async_to_sync(eight)()
    finally:
        request_finished.disconnect(record)

    assert statuses == [200] * 8
    assert len(seen) == 8
    assert len({name for name, _ in seen}) == 2
    assert all(name.startswith("django-request") for name, _ in seen)
    assert len({wrapper for _, wrapper in seen}) == 2


@pytest.mark.slow
def test_threads_stay_bounded_while_django_is_stuck_and_the_queue_answers_503():
    """Every lent thread stuck (a database that does not answer): no thread more is
    started, and the requests queued past BELLWETHER_DJANGO_QUEUE_S are 503."""
    release = threading.Event()

    class Stuck:
        def __init__(self):
            self.threads: set[str] = set()

        async def __call__(self, scope, receive, send):
            async with ThreadSensitiveContext():
                def stuck():
                    self.threads.add(threading.current_thread().name)
                    release.wait(10)
                await sync_to_async(stuck)()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    inner = Stuck()
    admission = DjangoAdmission(inner)

    async def scene():
        calls = [asyncio.create_task(_call(admission, _no_body)) for _ in range(6)]
        done, _ = await asyncio.wait(calls, timeout=3)  # the four queued: 503 after 1 s
        stuck_on = set(inner.threads)
        release.set()
        return [c.result()[0]["status"] for c in done], stuck_on, await asyncio.gather(*calls)
    early, stuck_on, answers = async_to_sync(scene)()

    assert early == [503] * 4
    assert len(stuck_on) == 2 and all(name.startswith("django-request") for name in stuck_on)
    assert inner.threads == stuck_on  # the queued ones never reached Django
    assert sorted(a[0]["status"] for a in answers) == [200, 200, 503, 503, 503, 503]
