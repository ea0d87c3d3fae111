"""A refused websocket handshake is answered 403 and its consumer ends.

An ASGI app refuses a handshake by sending `websocket.close` before
`websocket.accept`; the server must then answer HTTP 403. Granian (production)
sometimes answers nothing on a fresh worker — the client waits until its own
timeout — and then never delivers `websocket.disconnect`, so a Channels consumer
waits on `receive()` forever (emmett-framework/granian#818). Where the server
offers the WebSocket Denial Response extension, the refusal is sent as that
403 response instead, and the app's next `receive()` is the disconnect that
ends it. Servers without the extension (Daphne under runserver) get the close.
"""

DENIAL = "websocket.http.response"
FORBIDDEN = b"Forbidden\n"


class WebsocketRefusals:
    """ASGI middleware: a close before accept becomes a 403 denial response."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "websocket" or DENIAL not in scope.get("extensions", {}):
            return await self.app(scope, receive, send)
        handshake = {"answered": False, "denied": False}

        async def refusal_aware_send(message):
            kind = message["type"]
            if kind == "websocket.close" and not handshake["answered"]:
                handshake["answered"] = handshake["denied"] = True
                await send({"type": "websocket.http.response.start", "status": 403,
                            "headers": [(b"content-type", b"text/plain"),
                                        (b"content-length", str(len(FORBIDDEN)).encode())]})
                await send({"type": "websocket.http.response.body", "body": FORBIDDEN})
                return
            if kind in ("websocket.accept", "websocket.http.response.start"):
                handshake["answered"] = True
            await send(message)

        async def refusal_aware_receive():
            if handshake["denied"]:
                return {"type": "websocket.disconnect", "code": 1006}
            return await receive()

        return await self.app(scope, refusal_aware_receive, refusal_aware_send)
