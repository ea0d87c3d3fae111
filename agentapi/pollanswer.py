"""The headers of Django's answers to a route, learned as they pass, for an edge's
own answers to that route: the report edge (agentapi.report_edge) sends them with
the reports it records (`LearnedHeaders`)."""

from django.core.signals import setting_changed
from django.dispatch import receiver

# Accept headers under which the API renders JSON (DRF's first renderer).
JSON_ACCEPTED = frozenset({None, "*/*", "application/json"})
# Headers of the one request Django answered, never sent to another: its request id
# (project/requestid.py), which the client may have chosen.
PER_REQUEST = frozenset({b"x-request-id"})
# Headers of Django's answer that are the answer's own, not the route's.
_OWN = PER_REQUEST | {b"etag", b"content-length", b"date", b"server"}


class LearnedHeaders:
    """The headers Django sent with its JSON answers (of `statuses`) to one route,
    per scheme (HTTPS or not), learned from those answers as they pass (`learning`)
    for the edge to send with its own; none until Django answered one such request
    in this process, or after a settings change."""

    def __init__(self, statuses: frozenset[int]):
        self.statuses = statuses
        self.by_scheme: dict[bool, list[tuple[bytes, bytes]]] = {}
        _learned.append(self)

    def of(self, secure: bool | None) -> list[tuple[bytes, bytes]] | None:
        return None if secure is None else self.by_scheme.get(secure)

    def learning(self, send, secure: bool | None):
        """`send`, noting the headers of Django's answer when it is JSON, of one of
        the statuses, and sets no cookie (`secure` None: a request whose answer the
        edge never sends; nothing is noted)."""
        if secure is None:
            return send

        async def noting(message):
            if message["type"] == "http.response.start" and message["status"] in self.statuses:
                headers = [(n.lower(), v) for n, v in message.get("headers") or ()]
                names = {n for n, _ in headers}
                if ((b"content-type", b"application/json") in headers
                        and b"set-cookie" not in names):
                    self.by_scheme[secure] = [(n, v) for n, v in headers if n not in _OWN]
            await send(message)

        return noting


_learned: list[LearnedHeaders] = []


@receiver(setting_changed)
def _settings_changed(**kwargs):
    for learned in _learned:  # Django's headers follow its settings
        learned.by_scheme.clear()


async def send_json(send, status: int, headers, body: bytes, *extra) -> None:
    """An answer of the edge: Django's learned `headers`, `extra` ones, the body."""
    await send({"type": "http.response.start", "status": status, "headers": [
        *headers, *extra, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
