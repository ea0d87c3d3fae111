"""The poll's 200 answered by the poll edge (agentapi.edge) from the cache.

After a change, an agent's If-None-Match names its old answer while the cache may
already hold the new one (written through by the change on commit, or by a poll
Django answered). The edge then sends that cached body with exactly the headers
Django sent with a desired 200 before in this process — learned from Django's own
answers (the same scheme; every header but ETag, Content-Length, Date, Server and X-Request-ID),
so middleware and settings stay Django's to decide — and the new ETag. Until
Django has answered one such 200 here, the edge sends none. Only for a GET whose
Accept makes the API render JSON; a second 200 of the same answer to the same
token from this process goes to Django again (an agent that ignores ETags meets
the API's per-agent throttle there, as before). The report edge
(agentapi.report_edge) learns the headers of Django's report answers the same way
(`LearnedHeaders`).
"""

from django.core.signals import setting_changed
from django.dispatch import receiver

# Accept headers under which the API renders JSON (DRF's first renderer).
JSON_ACCEPTED = frozenset({None, "*/*", "application/json"})
# Headers of the one request Django answered, never sent to another: its request id
# (project/requestid.py), which the client may have chosen.
PER_REQUEST = frozenset({b"x-request-id"})
# Headers of Django's answer that are the answer's own, not the route's.
_OWN = PER_REQUEST | {b"etag", b"content-length", b"date", b"server"}
MAX_REMEMBERED = 100_000

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
desired_headers = LearnedHeaders(frozenset({200}))
_sent: dict[str, str] = {}  # token key -> the ETag the edge last sent it with a 200


@receiver(setting_changed)
def _settings_changed(**kwargs):
    for learned in _learned:  # Django's headers follow its settings
        learned.by_scheme.clear()


def may_send(secure: bool | None, key: str, etag: str) -> bool:
    """Whether the edge may answer this poll's 200 (`secure`: None unless the poll
    is a GET asking for JSON, else whether it came over HTTPS)."""
    return desired_headers.of(secure) is not None and _sent.get(key) != etag


async def send_changed(send, secure: bool, key: str, etag: str, body: bytes) -> None:
    if len(_sent) >= MAX_REMEMBERED:
        _sent.clear()
    _sent[key] = etag
    await send_json(send, 200, desired_headers.of(secure), body,
                    (b"etag", etag.encode("latin-1")))


async def send_json(send, status: int, headers, body: bytes, *extra) -> None:
    """An answer of the edge: Django's learned `headers`, `extra` ones, the body."""
    await send({"type": "http.response.start", "status": status, "headers": [
        *headers, *extra, (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def learning(send, secure: bool | None):
    """`send`, noting the headers of Django's 200 to a GET of the desired state
    asking for JSON (`secure` as may_send's), unless it sets a cookie."""
    return desired_headers.learning(send, secure)
