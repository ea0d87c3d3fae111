"""A refused websocket handshake (project/refusals.py): answered with a 403 denial
response where the server offers the extension, and the consumer then ends.
Against granian itself: tests/e2e/test_production_server.py."""

import asyncio

import pytest
from channels.generic.websocket import AsyncWebsocketConsumer
from channels.security.websocket import WebsocketDenier

from project.refusals import DENIAL, WebsocketRefusals

# A consumer closes old database connections around each message.
pytestmark = pytest.mark.django_db(transaction=True)

class Server:
    """The server side of one handshake: what the app sent, and its messages."""

    def __init__(self):
        self.sent: list[dict] = []
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.inbox.put_nowait({"type": "websocket.connect"})

    async def receive(self):
        return await self.inbox.get()

    async def send(self, message):
        self.sent.append(message)


def scope(extensions: dict) -> dict:
    return {"type": "websocket", "path": "/ws/live/", "headers": [], "extensions": extensions}


class Welcoming(AsyncWebsocketConsumer):
    async def connect(self):
        await self.accept()
        await self.close(code=4000)


async def ends_by_itself(application) -> None:
    """Run the application; it must end by itself within 5 s. (wait_for would not
    do: a consumer that swallows the cancellation at its timeout passes it.)"""
    task = asyncio.ensure_future(application)
    done, _ = await asyncio.wait({task}, timeout=5)
    if not done:
        task.cancel()
        pytest.fail("the consumer did not end by itself within 5 s")
    task.result()


async def serve(app, extensions: dict) -> Server:
    server = Server()
    # The consumer must end by itself: nothing here ever sends a disconnect.
    await ends_by_itself(WebsocketRefusals(app)(scope(extensions), server.receive,
                                                server.send))
    return server


async def test_a_refusal_is_a_403_response_and_the_consumer_ends():
    server = await serve(WebsocketDenier.as_asgi(), {DENIAL: {}})

    assert [m["type"] for m in server.sent] == ["websocket.http.response.start",
                                               "websocket.http.response.body"]
    assert server.sent[0]["status"] == 403
    assert server.sent[1]["body"] == b"Forbidden\n"


async def test_without_the_extension_the_close_goes_through():
    server = Server()
    server.inbox.put_nowait({"type": "websocket.disconnect", "code": 1006})
    await ends_by_itself(WebsocketRefusals(WebsocketDenier.as_asgi())(
        scope({}), server.receive, server.send))

    assert [m["type"] for m in server.sent] == ["websocket.close"]


async def test_a_close_after_accept_stays_a_close():
    server = Server()
    server.inbox.put_nowait({"type": "websocket.disconnect", "code": 4000})
    await ends_by_itself(WebsocketRefusals(Welcoming.as_asgi())(
        scope({DENIAL: {}}), server.receive, server.send))

    assert [m["type"] for m in server.sent] == ["websocket.accept", "websocket.close"]
    assert server.sent[1]["code"] == 4000
