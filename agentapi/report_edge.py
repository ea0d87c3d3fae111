"""Agents' reports, recorded in front of Django a batch at a time.

After a publish every agent of an environment reports within seconds; through
Django each report is a request of its own (its middleware, its authentication's
joins, its transaction and live events: tens of milliseconds of Python holding the
process's interpreter), so ten thousand reports queue for minutes. `ReportEdge`
takes a POST of /api/v1/agent/reports off the event loop instead, when

- it has no query string, a JSON body (`Content-Type: application/json`) of at most
  MAX_BODY bytes, an `Accept` DRF answers with JSON;
- it passes the checks of the poll's 304 (agentapi.edge.vouched_state: an
  allowed Host, an address not refused, HTTPS when required, an agent token its
  cached poll state vouches for, with no unsettled poll debt) and is within the
  agent's API rate (edge.within_rate);
- Django has answered a report in this process (the edge sends its headers);
- tasks are queued, not run inline (embedded mode runs a report's rollout
  reconcile in its request: in a batch it would hold every other report);

and records it with the other reports that arrived meanwhile: while one batch is
being written (on a thread, one transaction: apps.releases.services.reports_intake),
the next gathers (BATCH_GATHER_S more when the last held several), so one report
alone waits for nothing and a thousand arriving at once cost a few queries. Each
body is parsed and validated by the API's own parser and serializer. A report
recorded is answered here (201, or 200 for a duplicate, with the bytes Django would
send); one refused (invalid, a conflict, an agent revoked or its token rotated
meanwhile), a batch the database failed, and every request above that the edge may
not take go to Django with their bodies unchanged, which answers as before (400,
401, 404, 409, 429, 503 with the error envelope) — a refused report writes nothing,
so Django decides it afresh. Each event loop has its batches (its futures are
resolved on it alone).
"""

import asyncio
import io
import logging
import weakref

from django.db import DatabaseError, connection
from rest_framework.renderers import JSONRenderer

from agentapi import edge, longpoll
from agentapi.edge import within_rate
from agentapi.pollanswer import JSON_ACCEPTED, LearnedHeaders, send_json
from apps.core import metrics
from apps.core.dispatch import tasks_inline
from apps.core.events import serving_loop_is
from apps.core.parsers import BoundedJSONParser
from apps.core.throttling import AGENT_RATE_COUNTED
from apps.fleet.agent_api import ReportApi
from apps.fleet.reports import Recorded, Report
from apps.releases.services import reports_intake

logger = logging.getLogger(__name__)

REPORTS_PATH = "/api/v1/agent/reports"
# A report's body: a message of 4,000 characters and a probe's output of 2,000, each
# at most six bytes a character in JSON (a \u escape), fit well within this.
MAX_BODY = 64 * 1024
BATCH_MAX = 1000
# Under load (the last batch held more than one report) the next batch gathers this
# long before it is written: a batch costs a few queries and a transaction whatever
# its size, so ten batches of 50 cost far more than one of 500.
BATCH_GATHER_S = 0.05
_ALSO_READ = frozenset({b"content-type"})

report_headers = LearnedHeaders(frozenset({200, 201}))


def _report_scope(scope) -> tuple[dict, bool] | None:
    """(the headers the edge reads, HTTPS) of a report the edge may take, before its
    token is checked; None for any other request."""
    if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != REPORTS_PATH
            or scope.get("query_string")):
        return None
    if tasks_inline():  # a report's reconcile would run in the batch, holding every other
        return None
    headers, content = edge._headers(scope), edge.headers_once(scope, _ALSO_READ)
    if headers is None or content is None or content.get(b"content-type") != "application/json":
        return None
    if headers.get(b"accept") not in JSON_ACCEPTED:
        return None
    return headers, edge.is_secure(scope, headers)


async def _body(receive) -> tuple[list[dict], bytes | None]:
    """The request's messages as received, and its body: None when it is longer
    than MAX_BODY or the client left (the messages then go to Django as they are)."""
    messages, size = [], 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > MAX_BODY:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replayed(messages: list[dict], receive):
    """`receive` for Django: the messages the edge read, then the client's own."""
    pending = list(messages)

    async def replaying():
        return pending.pop(0) if pending else await receive()
    return replaying


def _read(body: bytes) -> tuple | None:
    """The report a body holds, as the API view reads it (its parser and serializer),
    without its agent; None when the API would refuse it (Django then answers)."""
    try:
        data = ReportApi.ReportRequestSerializer(data=BoundedJSONParser().parse(io.BytesIO(body)))
        if not data.is_valid():
            return None
    except Exception:  # noqa: BLE001 - any doubt: Django answers
        return None
    v = data.validated_data
    return (v["deployment_id"], v["snapshot"], v["checksum"], v["status"], v["message"],
            None if v["health"] is None else dict(v["health"]))


def _reports_of(batch: list[tuple[int, str, bytes]]) -> list[Report | None]:
    """Each body read once per batch: after a publish most agents send the same."""
    read: dict[bytes, tuple | None] = {}
    reports = []
    for agent_id, token_key, body in batch:
        if body not in read:
            read[body] = _read(body)
        fields = read[body]
        reports.append(None if fields is None else Report(agent_id, *fields, token_key))
    return reports


def _answer(result) -> tuple[int, bytes] | None:
    if not isinstance(result, Recorded):
        return None
    deployment, created = result
    if created:
        metrics.report_accepted(deployment.state)
    return 201 if created else 200, JSONRenderer().render(  # the API's bytes
        {"deployment_id": str(deployment.pk), "state": deployment.state,
         "duplicate": not created})


def _recorded(batch: list[tuple[int, str, bytes]]) -> list[tuple[int, bytes] | None]:
    """Each report's answer (status, body), or None for Django to answer; on this
    thread's own database connection, handed back to the pool after."""
    reports = _reports_of(batch)
    valid = [report for report in reports if report is not None]
    try:
        results = iter(reports_intake(valid) if valid else [])
    except DatabaseError:
        logger.warning("%d report(s) not recorded here; left to Django", len(valid),
                       exc_info=True)
        return [None] * len(batch)
    finally:  # the executor's thread keeps no pooled connection between its jobs
        if not connection.in_atomic_block:  # (a test's transaction holds it)
            connection.close()
    return [None if report is None else _answer(next(results)) for report in reports]


class _Batches:
    """The reports of an event loop waiting for the batch being written, written
    together once it is done (at most BATCH_MAX at a time)."""

    def __init__(self):
        self._waiting: list[tuple[int, str, bytes, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None

    async def recorded(self, agent_id: int, token_key: str,
                       body: bytes) -> tuple[int, bytes] | None:
        answer = asyncio.get_running_loop().create_future()
        self._waiting.append((agent_id, token_key, body, answer))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._write())
        return await answer

    async def _write(self) -> None:
        serving_loop_is(asyncio.get_running_loop())  # live events leave through it
        while self._waiting:
            batch, self._waiting = self._waiting[:BATCH_MAX], self._waiting[BATCH_MAX:]
            try:
                answers = await asyncio.to_thread(_recorded, [entry[:3] for entry in batch])
            except Exception:  # noqa: BLE001 - never leave a report unanswered
                logger.exception("report batch failed; left to Django")
                answers = [None] * len(batch)
            for (*_, answer), result in zip(batch, answers, strict=True):
                if not answer.done():
                    answer.set_result(result)
            if len(batch) > 1:
                await asyncio.sleep(BATCH_GATHER_S)


# Per event loop: a loop's futures are resolved by its own writer, never by another
# loop's (whose thread it is not; a loop closed with reports waiting would stop it).
_batches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def batch_recorded(agent_id: int, token_key: str, body: bytes) -> tuple[int, bytes] | None:
    """The report's answer once its batch is written (None: Django answers)."""
    loop = asyncio.get_running_loop()
    batches = _batches.get(loop) or _batches.setdefault(loop, _Batches())
    return await batches.recorded(agent_id, token_key, body)


class ReportEdge:
    """ASGI middleware: records agents' reports in batches when it may, hands on the
    rest (and learns the headers of Django's answers to reports)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        taken = _report_scope(scope)
        if taken is None:
            return await self.app(scope, receive, send)
        headers, secure = taken
        learned = report_headers.of(secure)
        vouched = await edge.vouched_state(scope, headers) if learned is not None else None
        if vouched is None or not await within_rate(vouched[1]["agent_id"]):
            return await self.app(scope, receive, report_headers.learning(send, secure))
        await longpoll.woken_polls_first()
        token_key, agent_id = vouched[0], vouched[1]["agent_id"]
        messages, body = await _body(receive)
        answer = None if body is None else await batch_recorded(agent_id, token_key, body)
        if answer is None:  # counted against the agent's rate already: once is enough
            return await self.app({**scope, AGENT_RATE_COUNTED: True},
                                  _replayed(messages, receive),
                                  report_headers.learning(send, secure))
        await send_json(send, answer[0], learned, answer[1])
        return None
