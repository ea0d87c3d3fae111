"""The report edge (agentapi/report_edge.py): agents' reports recorded in front of
Django a batch at a time, answered as Django answers them; everything the edge may
not take, and every report it would refuse, handed to Django with its body.

Django here is the test client behind an ASGI shim (DjangoByClient);
the edge's thread hops run on the test's thread, in its transaction."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import OperationalError, transaction
from django.test import Client

from agentapi import report_edge
from agentapi.report_edge import ReportEdge
from apps.core import events
from apps.core.throttling import AGENT_RATE_COUNTED
from apps.fleet import enrollment, polldebt, reports
from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from project.celery import app as celery_app
from tests.agentroutes import DJANGO_ITSELF, received_body
from tests.factories import enrolled_agent, poll
from tests.fleet.support import REPORTS


class DjangoByClient:
    """Django as an ASGI application, through the test client; counts its calls."""

    def __init__(self):
        self.calls = 0

    async def __call__(self, scope, receive, send):
        self.calls += 1
        response = await sync_to_async(self.answer)(scope)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": self.headers(response)})
        await send({"type": "http.response.body", "body": response.content})

    @staticmethod
    def answer(scope):
        return Client().generic(
            scope["method"], scope["path"], secure=scope["scheme"] == "https",
            QUERY_STRING=scope["query_string"].decode("latin-1"),
            headers={n.decode(): v.decode("latin-1") for n, v in scope["headers"]},
            **DJANGO_ITSELF)

    @staticmethod
    def headers(response):
        return [(n.encode(), v.encode("latin-1")) for n, v in response.items()] + [
            (b"set-cookie", c.output(header="").strip().encode())
            for c in response.cookies.values()]


async def _on_the_tests_thread(function, *args):
    return await sync_to_async(function)(*args)


@pytest.fixture
def django_app(monkeypatch):
    """The edge's reads on the test's thread (and connection), and an empty edge."""
    monkeypatch.setattr(asyncio, "to_thread", _on_the_tests_thread)
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=lambda: 0.0))
    yield DjangoByClient()


def per_request_removed(answer):
    """Django's answer without what belongs to its one request (its X-Request-ID),
    which the edge never replays."""
    status, headers, body = answer
    return status, [(n, v) for n, v in headers if n.lower() != b"x-request-id"], body


def named(headers) -> dict[bytes, bytes]:
    return {name.lower(): value for name, value in headers}


def error_code(answer) -> str:
    status, headers, body = answer
    assert named(headers)[b"content-type"] == b"application/json", headers
    return json.loads(body)["error"]["code"]


def polled(agent):
    """The agent after its first polls: its poll state is cached and the poll debts
    read, as on a web node."""
    etag = poll(agent.client)["ETag"]
    assert poll(agent.client, etag).status_code == 304
    agent.headers = [("Host", "testserver"), ("Authorization", f"Bearer {agent.token}"),
                     ("Accept-Encoding", "gzip")]
    return agent


class DjangoWithBodies(DjangoByClient):
    """DjangoByClient, handing Django the request's body as the client sent it."""

    def __init__(self):
        super().__init__()
        self.scopes = []

    async def __call__(self, scope, receive, send):
        self.scopes.append(scope)
        body = await received_body(receive)
        self.calls += 1
        response = await sync_to_async(self.answer_with)(scope, body)
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": self.headers(response)})
        await send({"type": "http.response.body", "body": response.content})

    @staticmethod
    def answer_with(scope, body):
        headers = {n.decode(): v.decode("latin-1") for n, v in scope["headers"]}
        return Client().generic(
            scope["method"], scope["path"], data=body,
            content_type=headers.pop("content-type", ""), secure=scope["scheme"] == "https",
            QUERY_STRING=scope["query_string"].decode("latin-1"), headers=headers,
            **DJANGO_ITSELF)


@pytest.fixture
def django(django_app, monkeypatch):  # noqa: F811 - the fixture above
    """Django behind the edge, with tasks queued (as in production), not inline."""
    monkeypatch.setitem(celery_app.conf, "task_always_eager", False)
    report_edge.report_headers.by_scheme.clear()
    yield DjangoWithBodies()
    report_edge.report_headers.by_scheme.clear()


def body_of(snapshot, *, status="succeeded", message="", checksum=None, **extra) -> bytes:
    return json.dumps({"deployment_id": None, "snapshot": snapshot.number,
                       "checksum": checksum or snapshot.checksum, "status": status,
                       "message": message, **extra}).encode()


def scope_of(agent, *, headers=(), query=b"", method="POST", path=REPORTS):
    sent_headers = [("host", "testserver"), ("authorization", f"Bearer {agent.token}"),
                    ("content-type", "application/json"), *headers]
    return {"type": "http", "method": method, "path": path, "query_string": query,
            "scheme": "http", "client": ("10.0.0.7", 50000),
            "headers": [(n.lower().encode(), v.encode()) for n, v in sent_headers]}


async def _posted(app, scope, body: bytes, chunk: int | None = None):
    parts = [body] if chunk is None else [body[i:i + chunk] for i in range(0, len(body), chunk)]
    messages = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
                for i, part in enumerate(parts)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await ReportEdge(app)(scope, receive, send)
    return (sent[0]["status"], list(sent[0]["headers"]),
            b"".join(m.get("body", b"") for m in sent[1:]))


def posted(app, agent, body: bytes, **options):
    chunk = options.pop("chunk", None)
    return async_to_sync(_posted)(app, scope_of(agent, **options), body, chunk)


@pytest.fixture
def agents(django, enroll, first):
    """Three agents of shop/prod, polled (their tokens in the cache), and the edge
    taught Django's headers by a first report Django answered."""
    taught, *rest = [polled(enroll(f"web-{i}")) for i in range(1, 5)]
    assert posted(django, taught, body_of(first))[0] == 201
    assert django.calls == 1
    return rest


def test_a_report_is_recorded_at_the_edge_and_answered_as_django_answers(
        agents, first, django, django_assert_num_queries):
    agent = agents[0]
    with django_assert_num_queries(8):
        from_edge = posted(django, agent, body_of(first, message="applied"))
    again = posted(DjangoWithBodies(), agents[1], body_of(first, message="applied"))

    assert django.calls == 1  # only the first report, which taught the headers
    status, headers, body = from_edge
    assert status == 201 and json.loads(body)["duplicate"] is False
    assert [n for n, _ in headers] == [n for n, _ in per_request_removed(again)[1]]
    deployment = Deployment.objects.get(pk=json.loads(body)["deployment_id"])
    assert (deployment.agent_id, deployment.state, deployment.message) == (
        agent.agent.pk, "succeeded", "applied")
    assert agent.fresh().applied_number == first.number


def test_the_same_report_again_is_a_duplicate_answered_200(agents, first, django):
    first_answer = posted(django, agents[0], body_of(first))
    second_answer = posted(django, agents[0], body_of(first))

    assert (first_answer[0], second_answer[0]) == (201, 200)
    assert json.loads(second_answer[2]) == {**json.loads(first_answer[2]), "duplicate": True}
    assert Deployment.objects.filter(agent=agents[0].agent).count() == 1


@pytest.mark.parametrize(("body", "status", "code"), [
    (b'{"snapshot": 1', 400, "parse_error"),
    (b'{"snapshot": 1, "snapshot": 1, "checksum": "x", "status": "succeeded"}', 400,
     "invalid"),
    (b'[]', 400, "invalid"),
    (b'{"snapshot": true, "checksum": "x", "status": "succeeded"}', 400, "invalid"),
    (b'{"snapshot": 1, "checksum": "sha256:nope", "status": "succeeded"}', 400,
     "checksum_mismatch"),
    (b'{"snapshot": 7, "checksum": "x", "status": "succeeded"}', 400, "invalid"),
    (b'{"snapshot": 1, "checksum": "x", "status": "pending"}', 400, "invalid"),
    (b'{"deployment_id": "00000000-0000-0000-0000-000000000000", "snapshot": 1, '
     b'"checksum": "x", "status": "succeeded"}', 404, "not_found"),
    (b'{"snapshot": 1, "checksum": "x", "status": "failed", "message": "\\u0000"}', 400,
     "invalid"),
])
def test_a_report_the_api_refuses_is_djangos_with_its_body_and_writes_nothing(
        agents, django, body, status, code):
    before = Deployment.objects.count()

    answer = posted(django, agents[0], body)

    assert (answer[0], error_code(answer)) == (status, code)
    assert django.calls == 2 and Deployment.objects.count() == before
    assert agents[0].fresh().last_report_at is None
    # The edge counted it against the agent's rate: Django is told not to again.
    assert django.scopes[-1][AGENT_RATE_COUNTED] is True
    assert AGENT_RATE_COUNTED not in django.scopes[0]  # the first, handed on uncounted


def test_a_conflicting_report_of_a_push_is_djangos_409(agents, first, django, superuser):
    [push] = releases.snapshot_deploy(snapshot=first, agent_ids=[agents[0].agent.pk],
                                      actor=superuser)
    polled(agents[0])  # its poll answer now names the push
    body = body_of(first, deployment_id=str(push.pk), status="failed", message="disk full")
    assert posted(django, agents[0], body)[0] == 201

    answer = posted(django, agents[0], body_of(first, deployment_id=str(push.pk),
                                               status="failed", message="other"))

    assert (answer[0], error_code(answer)) == (409, "report_conflict")
    push.refresh_from_db()
    assert (push.state, push.message, django.calls) == ("failed", "disk full", 2)


@pytest.mark.parametrize("case", ["query string", "text/plain", "charset", "accept html",
                                  "content-type twice", "GET", "other path", "no token",
                                  "revoked", "large body"])
def test_what_the_edge_may_not_take_goes_to_django(agents, first, django, superuser, case,
                                                   django_capture_on_commit_callbacks):
    agent, body, options = agents[0], body_of(first), {}
    if case == "query string":
        options["query"] = b"x=1"
    elif case in ("text/plain", "charset", "content-type twice", "accept html"):
        options["headers"] = {
            "text/plain": [("content-type", "text/plain")],
            "charset": [("content-type", "application/json; charset=utf-8")],
            "content-type twice": [("content-type", "application/json")],
            "accept html": [("accept", "text/html")]}[case]
    elif case == "GET":
        options["method"] = "GET"
    elif case == "other path":
        options["path"] = REPORTS + "/"
    elif case == "no token":
        agent.token = "bwa_000000000000." + "x" * 43
    elif case == "revoked":
        with django_capture_on_commit_callbacks(execute=True):
            enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)
    elif case == "large body":
        body = body_of(first, message="x" * 4001, padding=" " * report_edge.MAX_BODY)

    answer = posted(django, agent, body, **options)

    assert django.calls == 2
    assert answer[0] in (201, 400, 401, 404, 405, 406, 415)


def test_with_tasks_inline_every_report_is_djangos(agents, first, django, monkeypatch):
    """Embedded mode runs a report's rollout reconcile in its request: in a batch it
    would hold every other report of the process."""
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)

    assert posted(django, agents[0], body_of(first))[0] == 201
    assert django.calls == 2


def test_a_body_in_many_parts_is_read_whole(agents, first, django):
    answer = posted(django, agents[0], body_of(first, message="m" * 300), chunk=7)

    assert answer[0] == 201 and django.calls == 1
    assert agents[0].fresh().last_message == "m" * 300


def test_a_database_failure_leaves_the_batch_to_django(agents, first, django, monkeypatch):
    def failing(reports):
        raise OperationalError("connection refused")
    monkeypatch.setattr(report_edge, "reports_intake", failing)

    answer = posted(django, agents[0], body_of(first))

    assert answer[0] == 201 and django.calls == 2  # Django recorded it
    assert agents[0].fresh().applied_number == first.number


def test_concurrent_reports_are_recorded_in_one_batch(agents, first, django, monkeypatch):
    batches = []
    original = report_edge.reports_intake

    def counted(reports):
        batches.append(len(reports))
        return original(reports)
    monkeypatch.setattr(report_edge, "reports_intake", counted)

    async def all_at_once():
        return await asyncio.gather(*(_posted(django, scope_of(a), body_of(first))
                                      for a in agents))

    answers = async_to_sync(all_at_once)()

    assert [a[0] for a in answers] == [201] * 3 and batches == [3]
    assert django.calls == 1
    assert {a.fresh().applied_number for a in agents} == {first.number}


# --- the batch: reports_record ------------------------------------------------------


def _report(agent, snapshot, **fields):
    return reports.Report(agent.pk, None, snapshot.number, snapshot.checksum,
                          fields.pop("status", "succeeded"), **fields)


@pytest.mark.parametrize("size", [5, 50])
def test_a_batch_costs_the_same_queries_whatever_its_size(
        environment, first, superuser, size, django_assert_num_queries):
    agents = [enrolled_agent(environment, f"n-{i}", actor=superuser).agent
              for i in range(size)]

    with django_assert_num_queries(8):
        results = releases.reports_intake([_report(a, first) for a in agents])

    assert all(r.created for r in results)
    assert Agent.objects.filter(applied_number=first.number).count() == size


def test_each_report_of_a_batch_is_decided_alone(environment, first, superuser):
    good, bad, twice = [enrolled_agent(environment, n, actor=superuser).agent
                        for n in ("good", "bad", "twice")]
    batch = [_report(good, first),
             reports.Report(bad.pk, None, first.number, "sha256:wrong", "succeeded"),
             _report(twice, first, status="failed", message="disk full"),
             _report(twice, first, status="failed", message="disk full"),
             _report(twice, first)]

    results = releases.reports_intake(batch)

    assert [getattr(r, "created", None) for r in results] == [True, None, True, False, True]
    assert results[1].code == "checksum_mismatch"
    assert results[3].deployment == results[2].deployment  # the replay of a report
    bad.refresh_from_db()
    twice.refresh_from_db()
    assert (bad.last_report_at, Deployment.objects.filter(agent=bad).count()) == (None, 0)
    assert (twice.applied_number, twice.blocked_number, twice.last_status) == (
        first.number, None, "succeeded")  # the failure, then the success lifting its block
    assert Deployment.objects.filter(agent=twice).count() == 2


def test_a_batch_announces_once_per_environment(environment, first, superuser, monkeypatch,
                                                django_capture_on_commit_callbacks):
    sent = []
    monkeypatch.setattr(events, "_send", lambda group, message: sent.append(message["event"]))
    agents = [enrolled_agent(environment, f"n-{i}", actor=superuser).agent for i in range(3)]

    with django_capture_on_commit_callbacks(execute=True):
        releases.reports_intake([_report(a, first) for a in agents])
    with django_capture_on_commit_callbacks(execute=True):
        [(one, _)] = [releases.reports_intake([_report(agents[0], first, message="again")])[0]]

    assert sent[:2] == [{"kind": "deployment", "environment": environment.pk},
                        {"kind": "agent", "environment": environment.pk}]
    assert sent[2:] == [
        {"kind": "deployment", "environment": environment.pk, "id": str(one.pk),
         "agent": agents[0].pk, "snapshot": first.number},
        {"kind": "agent", "environment": environment.pk, "id": agents[0].pk}]


# --- found in review ------------------------------------------------------------------


def test_the_edge_answers_the_bytes_django_answers(agents, first, django):
    posted(django, agents[0], body_of(first))
    duplicate = posted(django, agents[0], body_of(first))

    from_django = DjangoWithBodies.answer_with(scope_of(agents[0]), body_of(first))

    assert (duplicate[0], from_django.status_code) == (200, 200) and django.calls == 1
    assert duplicate[2] == from_django.content  # DRF's compact JSON


def test_a_token_rotated_while_its_report_arrives_is_djangos_401(agents, first, django,
                                                                 superuser):
    agent = agents[0]
    messages = [{"type": "http.request", "body": body_of(first), "more_body": False}]
    sent = []

    async def receive():  # the body trickles in while the token is rotated
        if messages:
            await sync_to_async(enrollment.agent_token_rotate)(agent=agent.agent,
                                                               actor=superuser)
            return messages.pop(0)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    async_to_sync(ReportEdge(django))(scope_of(agent), receive, send)

    assert (sent[0]["status"], django.calls) == (401, 2)
    assert not Deployment.objects.filter(agent=agent.agent).exists()


def test_a_report_is_refused_when_its_token_is_no_longer_the_agents(environment, first,
                                                                    superuser):
    agent = enrolled_agent(environment, "n-1", actor=superuser).agent
    old_key = agent.token_key
    enrollment.agent_token_rotate(agent=agent, actor=superuser)
    agent.refresh_from_db()
    stale, current = (reports.Report(agent.pk, None, first.number, first.checksum,
                                     "succeeded", token_key=key)
                      for key in (old_key, agent.token_key))

    results = releases.reports_intake([stale, current])

    assert results[0].status == 401 and results[1].created


def test_reports_waiting_on_a_loop_gone_leave_the_next_loops_answered(agents, first):
    def recorded(agent):
        return report_edge.batch_recorded(agent.agent.pk, agent.agent.token_key, body_of(first))
    gone = asyncio.new_event_loop()
    gone.create_task(recorded(agents[0]))
    gone.call_soon(gone.stop)
    gone.run_forever()  # its report waits for a writer that never runs
    gone.close()

    async def on_the_next_loop():
        return await asyncio.wait_for(recorded(agents[1]), 5)

    assert async_to_sync(on_the_next_loop)()[0] == 201


def test_a_report_naming_another_agents_push_locks_nothing_of_it(agents, first, superuser):
    [push] = releases.snapshot_deploy(snapshot=first, agent_ids=[agents[1].agent.pk],
                                      actor=superuser)
    report = reports.Report(agents[0].agent.pk, push.pk, first.number, first.checksum,
                            "succeeded")

    with transaction.atomic():
        found = reports._Found([report])
        [result] = reports.reports_record([report])

    assert found.pushes == {} and result.status == 404
