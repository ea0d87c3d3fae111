"""POST /api/v1/agent/reports, an agent's report of an apply.

After a publish every agent reports within seconds; recorded one at a time (a
transaction, live events and the token's joins each) ten thousand queue for
minutes. So a JSON report from a token the cache vouches for, within its rate, is
recorded with those that arrived meanwhile: while one batch is written (a thread,
one transaction: apps.releases.services.reports_intake) the next gathers. Every
other request, and a report its batch refused or could not write, is answered from
the database after the route's checks (agentapi.checks): a refused report wrote
nothing, so it is decided afresh. Embedded mode (tasks inline) never batches: a
report's reconcile runs in its request.
"""

import asyncio
import io
import logging
import weakref

from django.db import DatabaseError
from django.http import HttpResponse
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request

from agentapi import cached, checks
from apps.core import metrics
from apps.core.dispatch import tasks_inline
from apps.core.events import serving_loop_is
from apps.core.fields import ShownTextField, WholeNumberField
from apps.core.parsers import BoundedJSONParser
from apps.fleet.agent_api import HealthSerializer
from apps.fleet.reports import Recorded, Report
from apps.releases.services import report_intake, reports_intake
from project.admission import connection_returned

logger = logging.getLogger(__name__)

REPORTS_PATH = "/api/v1/agent/reports"
METHODS = ("POST",)
# A report's body: a message of 4,000 characters and a probe's output of 2,000, each
# at most six bytes a character in JSON (a \u escape), fit well within this.
MAX_BATCHED_BODY = 64 * 1024
BATCH_MAX = 1000
# Under load (the last batch held more than one report) the next batch gathers this
# long before it is written: a batch costs a few queries and a transaction whatever
# its size, so ten batches of 50 cost far more than one of 500.
BATCH_GATHER_S = 0.05
# Set in the scope of a report counted against its agent's rate already (its batch
# refused it): its answer from the database does not count it again.
RATE_COUNTED = "bellwether.agent_rate_counted"


class UUIDTextField(serializers.UUIDField):
    """A UUID sent as text (DRF would take the number 5 for a UUID)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


class ReportSerializer(serializers.Serializer):
    deployment_id = UUIDTextField(allow_null=True, required=False, default=None)
    snapshot = WholeNumberField(min_value=1)
    checksum = serializers.CharField(max_length=71)
    status = serializers.ChoiceField(["succeeded", "warning", "failed"])
    message = ShownTextField(max_length=4000, allow_blank=True, required=False,
                             default="", trim_whitespace=False)
    health = HealthSerializer(required=False, allow_null=True, default=None)


class ReportAnswerSerializer(serializers.Serializer):
    deployment_id = serializers.UUIDField()
    state = serializers.CharField()
    duplicate = serializers.BooleanField()


def report_read(data) -> dict:
    """The report's fields (report_intake's keywords but the agent) from its parsed
    body; ValidationError (400) naming the field when the API refuses it."""
    report = ReportSerializer(data=data)
    report.is_valid(raise_exception=True)
    v = report.validated_data
    return {"deployment_id": v["deployment_id"], "number": v["snapshot"],
            "checksum": v["checksum"], "status": v["status"], "message": v["message"],
            "health": None if v["health"] is None else dict(v["health"])}


def report_response(recorded: Recorded) -> HttpResponse:
    """201 for a report recorded now, 200 for a duplicate (counted when new)."""
    deployment, created = recorded
    if created:
        metrics.report_accepted(deployment.state)
    return HttpResponse(JSONRenderer().render(
        {"deployment_id": str(deployment.pk), "state": deployment.state,
         "duplicate": not created}), status=201 if created else 200,
        content_type="application/json")


def report_answer(request) -> HttpResponse:
    """The route's answer from the database, once agentapi.checks passed."""
    agent = checks.authenticated_agent(request, counted=request.scope.get(RATE_COUNTED, False))
    body = Request(request, parsers=[BoundedJSONParser()])
    body.user = request.user  # (the parser's bound is an authenticated caller's)
    return report_response(report_intake(agent=agent, **report_read(body.data)))


def _batched_read(body: bytes) -> dict | None:
    """The report a JSON body holds, or None when the API would refuse it."""
    try:
        return report_read(BoundedJSONParser().parse(io.BytesIO(body)))
    except Exception:  # noqa: BLE001 - any doubt: the database's answer says why
        return None


def _reports_of(batch: list[tuple[int, str, bytes]]) -> list[Report | None]:
    """Each body read once per batch: after a publish most agents send the same."""
    read: dict[bytes, dict | None] = {}
    reports = []
    for agent_id, token_key, body in batch:
        if body not in read:
            read[body] = _batched_read(body)
        fields = read[body]
        reports.append(None if fields is None else Report(agent_id, token_key=token_key,
                                                          **fields))
    return reports


def _recorded(batch: list[tuple[int, str, bytes]]) -> list[HttpResponse | None]:
    """Each report's answer, or None for the database's answer."""
    reports = _reports_of(batch)
    valid = [report for report in reports if report is not None]
    try:
        results = iter(reports_intake(valid) if valid else [])
    except DatabaseError:
        logger.warning("%d report(s) not recorded in a batch; answered alone", len(valid),
                       exc_info=True)
        return [None] * len(batch)
    answers = []
    for report in reports:
        result = None if report is None else next(results)
        answers.append(report_response(result) if isinstance(result, Recorded) else None)
    return answers


class _Batches:
    """The reports of an event loop waiting for the batch being written, written
    together once it is done (at most BATCH_MAX at a time)."""

    def __init__(self):
        self._waiting: list[tuple[int, str, bytes, asyncio.Future]] = []
        self._writer: asyncio.Task | None = None

    async def recorded(self, agent_id: int, token_key: str, body: bytes) -> HttpResponse | None:
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
                # (the executor's thread keeps no pooled connection between its jobs)
                answers = await asyncio.to_thread(connection_returned, _recorded,
                                                  [entry[:3] for entry in batch])
            except Exception:  # noqa: BLE001 - never leave a report unanswered
                logger.exception("report batch failed; each answered alone")
                answers = [None] * len(batch)
            for (*_, answer), result in zip(batch, answers, strict=True):
                if not answer.done():
                    answer.set_result(result)
            if len(batch) > 1:
                await asyncio.sleep(BATCH_GATHER_S)


# Per event loop: a loop's futures are resolved by its own writer, never by another
# loop's (whose thread it is not; a loop closed with reports waiting would stop it).
_batches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


async def batch_recorded(agent_id: int, token_key: str, body: bytes) -> HttpResponse | None:
    """The report's answer once its batch is written (None: the database's answer)."""
    loop = asyncio.get_running_loop()
    batches = _batches.get(loop) or _batches.setdefault(loop, _Batches())
    return await batches.recorded(agent_id, token_key, body)


async def _received(receive) -> bytes:
    """The request's body, as project.bodylimits hands it on."""
    parts = []
    while True:
        message = await receive()
        parts.append(message.get("body", b""))
        if message["type"] != "http.request" or not message.get("more_body", False):
            return b"".join(parts)


async def _from_batch(scope, body: bytes) -> tuple[HttpResponse | None, bool]:
    """(the answer from a batch or None, whether the agent's rate counted it)."""
    if scope["method"] != "POST" or tasks_inline() or len(body) > MAX_BATCHED_BODY:
        return None, False
    headers, content = cached._headers(scope), cached.headers_once(scope, _CONTENT_TYPE)
    if headers is None or content is None or content.get(b"content-type") != "application/json":
        return None, False
    vouched = await cached.vouched_state(scope, headers)
    if vouched is None or not await cached.within_rate(vouched[1]["agent_id"]):
        return None, False
    return await batch_recorded(vouched[1]["agent_id"], vouched[0], body), True


_CONTENT_TYPE = frozenset({b"content-type"})


async def answer_report(scope, receive, send) -> None:
    """(Its body bounded and whole: agentapi.routes has project.bodylimits receive it.)"""
    body = await _received(receive)
    response, counted = await _from_batch(scope, body)
    if response is None:
        await checks.answered_on_thread({**scope, RATE_COUNTED: counted}, send, METHODS,
                                         report_answer, body)
    else:
        await checks.send_response(send, response)
