"""project/admission.py called directly: at most BELLWETHER_DJANGO_CONCURRENCY
requests inside Django at once, the rest queued on the loop, and a request queued
past BELLWETHER_DJANGO_QUEUE_S answered 503 with the envelope."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync

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


def _calls(app, paths, kind="http"):
    async def one(path):
        sent = []
        async def send(message):
            sent.append(message)
        await app({"type": kind, "path": path, "headers": []}, None, send)
        return sent
    async def all_of_them():
        return await asyncio.gather(*(one(path) for path in paths))
    return async_to_sync(all_of_them)()


def test_requests_beyond_the_limit_wait_their_turn_and_are_answered():
    inner = Slow(0.1)

    answers = _calls(DjangoAdmission(inner), ["/api/v1/agent/reports"] * 6)

    assert [a[0]["status"] for a in answers] == [200] * 6
    assert inner.most == 2


def test_a_request_queued_past_the_limit_is_503_with_the_envelope():
    inner = Slow(1.5)

    answers = _calls(DjangoAdmission(inner), ["/api/v1/agent/desired"] * 3)

    statuses = sorted(a[0]["status"] for a in answers)
    assert statuses == [200, 200, 503]
    busy = next(a for a in answers if a[0]["status"] == 503)
    assert (b"retry-after", b"5") in busy[0]["headers"]
    assert json.loads(busy[1]["body"])["error"]["code"] == "unavailable"


def test_liveness_and_websockets_are_never_queued():
    inner = Slow(0.3)

    answers = _calls(DjangoAdmission(inner), ["/healthz"] * 4 + ["/static/x.css"] * 2)
    assert [a[0]["status"] for a in answers] == [200] * 6
    assert inner.most == 6

    inner = Slow(0.1)
    _calls(DjangoAdmission(inner), ["/ws/events"] * 4, kind="websocket")
    assert inner.most == 4
