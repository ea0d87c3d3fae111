"""GET /api/v1/agent/snapshots/<number>/bundle, a snapshot's files.

The snapshot an agent's vouched poll state desires (a snapshot an agent desires
cannot be removed: apps.releases.retention) is answered on the event loop from its
gzip bytes, kept by what they are: (environment, number, checksum), at most
KEPT_MAX_BYTES per process, least recently used dropped first. Every other request
is answered from the database after the route's checks (agentapi.checks); both
answers are `bundle_response`'s.
"""

import contextlib
import json
import re
import threading
from collections import OrderedDict

from django.http import HttpResponse, HttpResponseNotModified
from django.utils.cache import get_conditional_response

from agentapi import cached, checks
from apps.core.compression import accepts_gzip
from apps.core.errors import NotFound
from apps.fleet import rules
from apps.snapshots.models import Snapshot
from project.admission import admission

BUNDLE_PATH = re.compile(r"/api/v1/agent/snapshots/([0-9]+)/bundle")
METHODS = ("GET", "HEAD")
MAX_NUMBER = 2**31 - 1  # a snapshot's number is a PositiveIntegerField
KEPT_MAX_BYTES = 64 * 1024 * 1024
_ALSO_READ = frozenset({b"accept-encoding"})


def requested_number(path: str) -> int | None:
    """The snapshot number of a bundle path, or None when longer than any can be."""
    digits = BUNDLE_PATH.fullmatch(path)[1].lstrip("0") or "0"
    return int(digits) if len(digits) <= len(str(MAX_NUMBER)) else None


def bundle_etag(checksum: str, gzip: bool) -> str:
    """Each representation has its own strong ETag (RFC 9110 8.8.3)."""
    return f'"{checksum}{"+gzip" if gzip else ""}"'


def bundle_response(etag: str, gzip: bool, body: bytes | None) -> HttpResponse:
    """The bundle's answer: its bytes (200), or 304 when `body` is None."""
    response = HttpResponseNotModified() if body is None else HttpResponse(
        body, content_type="application/json")
    if gzip and body is not None:
        response["Content-Encoding"] = "gzip"
    response["ETag"], response["Vary"] = etag, "Accept-Encoding"
    response["Cache-Control"] = "private, max-age=31536000, immutable"
    return response


def stored_bundle(environment_id: int, number: int, gzip: bool) -> tuple[str, bytes] | None:
    """(checksum, bytes) of the environment's ready snapshot `number`, gzip or not
    (only that column is read), or None."""
    column = "bundle_gzip" if gzip else "bundle"
    if not 1 <= number <= MAX_NUMBER:
        return None
    snapshot = (Snapshot.objects.filter(environment_id=environment_id, number=number,
                                        state=Snapshot.State.READY)
                .only("checksum", column).first())
    if snapshot is None:
        return None
    body = bytes(getattr(snapshot, column))
    if gzip:
        _kept.keep((environment_id, number, snapshot.checksum), body)
    return snapshot.checksum, body


def bundle_answer(request) -> HttpResponse:
    """The route's answer from the database, once agentapi.checks passed."""
    number = requested_number(request.path)
    agent = checks.authenticated_agent(request)
    gzip = accepts_gzip(request.headers.get("Accept-Encoding"))
    stored = None if number is None else stored_bundle(agent.environment_id, number, gzip)
    if stored is None:
        raise NotFound(f"No snapshot {'of that number' if number is None else number} "
                       "for this agent.")
    etag = bundle_etag(stored[0], gzip)
    conditional = get_conditional_response(request, etag=etag)
    if conditional is not None and conditional.status_code != 304:
        conditional["ETag"] = etag  # 412
        return conditional
    return bundle_response(etag, gzip, None if conditional is not None else stored[1])


class _Kept:
    """gzip bytes by (environment, number, checksum), the least recently used dropped
    first once they pass `max_bytes` (read on the event loop, kept from threads)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._bodies: OrderedDict[tuple, bytes] = OrderedDict()
        self._bytes = 0

    def get(self, key) -> bytes | None:
        with self._lock:
            body = self._bodies.get(key)
            if body is not None:
                self._bodies.move_to_end(key)
            return body

    def keep(self, key, body: bytes) -> None:
        if len(body) > self.max_bytes:
            return
        with self._lock:
            replaced = self._bodies.pop(key, None)
            self._bytes += len(body) - (len(replaced) if replaced is not None else 0)
            self._bodies[key] = body
            while self._bytes > self.max_bytes:
                _, dropped = self._bodies.popitem(last=False)
                self._bytes -= len(dropped)


_kept = _Kept(KEPT_MAX_BYTES)


def _kept_or_read(key: tuple[int, int, str]) -> bytes | None:
    """The gzip bytes of `key`, read (and kept) unless a request before this one
    kept them meanwhile; None when the environment has no such ready snapshot."""
    body = _kept.get(key)
    if body is None:
        stored_bundle(key[0], key[1], True)
        body = _kept.get(key)
    return body


async def kept_bundle(key: tuple[int, int, str]) -> bytes | None:
    """The gzip bytes of `key`, kept or read now on a lent thread; None when the
    environment has no such ready snapshot or the read failed."""
    body = _kept.get(key)
    if body is None:
        with contextlib.suppress(Exception):  # (Busy too) the database's answer says why
            body = await admission.run(_kept_or_read, key)
    return body


async def _from_kept(scope) -> HttpResponse | None:
    """The answer from the kept bytes, or None when the database answers."""
    number = requested_number(scope["path"])
    if scope["method"] != "GET" or scope.get("query_string"):
        return None
    headers, encoding = cached._headers(scope), cached.headers_once(scope, _ALSO_READ)
    if headers is None or encoding is None or not accepts_gzip(encoding.get(b"accept-encoding")):
        return None  # the identity bytes are the database's: agents ask for gzip
    vouched = await cached.vouched_state(scope, headers)
    desired = None if vouched is None else desired_snapshot(vouched[1])
    if desired is None or desired[0] != number or vouched[1].get("environment_id") is None:
        return None
    body = await kept_bundle((vouched[1]["environment_id"], number, desired[1]))
    if body is None or not await cached.within_rate(vouched[1]["agent_id"]):
        return None
    etag, asked = bundle_etag(desired[1], True), headers.get(b"if-none-match")
    matched = asked is not None and rules.if_none_match_matches(asked, etag)
    return bundle_response(etag, True, None if matched else body)


def desired_snapshot(state: dict) -> tuple[int, str] | None:
    """(number, checksum) of the snapshot a cached poll state desires, or None."""
    try:
        snapshot = json.loads(state["body"])["snapshot"]
        return (snapshot["number"], snapshot["checksum"]) if snapshot else None
    except (KeyError, TypeError, ValueError):
        return None


async def answer_bundle(scope, receive, send) -> None:
    response = await _from_kept(scope)
    if response is None:
        await checks.answered_on_thread(scope, send, METHODS, bundle_answer)
    else:
        await checks.send_response(send, response)
