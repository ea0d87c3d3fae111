"""The reports route (agentapi/reports.py) through the served HTTP stack: reports
recorded a batch at a time when the cache vouches for their token, every other
request and every report a batch refused answered from the database. An answer
from the database carries a request id; one from a batch does not (`source`).

The stack's thread hops run on the test's thread, in its transaction."""

import asyncio
import json

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import OperationalError, transaction

from agentapi import reports as route
from apps.core import events
from apps.fleet import enrollment, reports
from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from project.celery import app as celery_app
from tests.agentroutes import (
    HANDED_ON,
    asgi_answer,
    stack_answer,
    thread_hops_on_the_tests_thread,
)
from tests.factories import enrolled_agent
from tests.fleet.support import REPORTS
from tests.fleet.test_bundle_kept import polled

BATCH, DATABASE = "batch", "database"


@pytest.fixture
def queued(monkeypatch):
    """Tasks queued (as in production), not run inline: reports may be batched."""
    monkeypatch.setitem(celery_app.conf, "task_always_eager", False)


@pytest.fixture
def agents(queued, enroll, first):
    """Three agents of shop/prod, polled (their tokens in the cache)."""
    return [polled(enroll(f"web-{i}")) for i in range(1, 4)]


def body_of(snapshot, *, status="succeeded", message="", checksum=None, **extra) -> bytes:
    return json.dumps({"deployment_id": None, "snapshot": snapshot.number,
                       "checksum": checksum or snapshot.checksum, "status": status,
                       "message": message, **extra}).encode()


def scope_of(agent, body: bytes = b"", *, headers=(), method="POST", path=REPORTS):
    """A report's scope; `headers` replace the agent's of their names (None: left out)."""
    sent_headers = {"host": "testserver", "authorization": f"Bearer {agent.token}",
                    "content-type": "application/json", "content-length": str(len(body))}
    sent_headers.update(headers)
    sent_headers = [(n, v) for n, v in sent_headers.items() if v is not None]
    return {"type": "http", "method": method, "path": path, "query_string": b"",
            "scheme": "http", "client": ("10.0.0.7", 50000),
            "headers": [(n.lower().encode(), v.encode()) for n, v in sent_headers]}


def posted(agent, body: bytes, **options):
    """(status, headers, body) of the stack's answer to the report."""
    return stack_answer(scope_of(agent, body, **options), body=body)


def source(answer) -> str:
    return DATABASE if "x-request-id" in answer[1] else BATCH


def error_code(answer) -> str:
    assert answer[1]["content-type"] == "application/json", answer[1]
    return json.loads(answer[2])["error"]["code"]


def test_a_report_is_recorded_in_a_batch_and_answered_as_the_database_answers(
        agents, first, django_assert_num_queries):
    with django_assert_num_queries(8):
        batched = posted(agents[0], body_of(first, message="applied"))
    duplicate = posted(agents[0], body_of(first, message="applied"))
    duplicate_alone = posted(agents[0], body_of(first, message="applied"),
                             headers=[("content-type", "application/json; charset=utf-8")])

    assert [source(a) for a in (batched, duplicate, duplicate_alone)] == [
        BATCH, BATCH, DATABASE]
    assert (batched[0], duplicate[0], duplicate_alone[0]) == (201, 200, 200)
    assert duplicate[2] == duplicate_alone[2]  # DRF's compact JSON, either way
    assert set(duplicate[1]) == set(duplicate_alone[1]) - {"x-request-id"}
    assert json.loads(duplicate[2]) == {**json.loads(batched[2]), "duplicate": True}
    deployment = Deployment.objects.get(pk=json.loads(batched[2])["deployment_id"])
    assert (deployment.agent_id, deployment.state, deployment.message) == (
        agents[0].agent.pk, "succeeded", "applied")
    assert agents[0].fresh().applied_number == first.number


@pytest.mark.parametrize(("body", "status", "code"), [
    (b'{"snapshot": 1', 400, "parse_error"),
    (b'{"snapshot": 1, "snapshot": 1, "checksum": "x", "status": "succeeded"}', 400,
     "invalid"),
    (b'[]', 400, "invalid"),
    (b'', 400, "invalid"),
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
def test_a_report_the_batch_refuses_is_answered_alone_and_writes_nothing(
        agents, body, status, code):
    before = Deployment.objects.count()

    answer = posted(agents[0], body)

    assert (answer[0], error_code(answer), source(answer)) == (status, code, DATABASE)
    assert Deployment.objects.count() == before
    assert agents[0].fresh().last_report_at is None


def test_a_refused_report_counts_once_against_the_agents_rate(agents, first, settings):
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "agent": "2/minute"}

    answers = [posted(agents[0], body) for body in (b"[]", body_of(first), body_of(first))]

    assert [a[0] for a in answers] == [400, 201, 429]


def test_a_conflicting_report_of_a_push_is_409(agents, first, superuser):
    [push] = releases.snapshot_deploy(snapshot=first, agent_ids=[agents[0].agent.pk],
                                      actor=superuser)
    polled(agents[0])  # its poll answer now names the push
    body = body_of(first, deployment_id=str(push.pk), status="failed", message="disk full")
    assert posted(agents[0], body)[0] == 201

    answer = posted(agents[0], body_of(first, deployment_id=str(push.pk), status="failed",
                                       message="other"))

    assert (answer[0], error_code(answer)) == (409, "report_conflict")
    push.refresh_from_db()
    assert (push.state, push.message) == ("failed", "disk full")


@pytest.mark.parametrize(("case", "status"), [
    ("text/plain", 415), ("no content type", 415), ("charset", 201),
    ("content-type twice", 415), ("accept html", 201), ("GET", 405), ("PUT", 405),
    ("no token", 401), ("revoked", 401), ("large body", 400),
])
def test_what_a_batch_may_not_take_is_answered_alone(agents, first, superuser, case, status,
                                                    django_capture_on_commit_callbacks):
    agent, body, options = agents[0], body_of(first), {}
    if case in ("text/plain", "charset", "no content type", "accept html"):
        options["headers"] = {
            "text/plain": [("content-type", "text/plain")],
            "charset": [("content-type", "application/json; charset=utf-8")],
            "no content type": [("content-type", None)],
            "accept html": [("accept", "text/html")]}[case]
    elif case in ("GET", "PUT"):
        options["method"] = case
    elif case == "no token":
        agent.token = "bwa_000000000000." + "x" * 43
    elif case == "revoked":
        with django_capture_on_commit_callbacks(execute=True):
            enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)
    elif case == "large body":
        body = body_of(first, message="x" * 4001, padding=" " * route.MAX_BATCHED_BODY)
    scope = scope_of(agent, body, **options)
    if case == "content-type twice":  # joined as Django's ASGI request joins it
        scope["headers"].append((b"content-type", b"application/json"))

    answer = stack_answer(scope, body=body)

    assert (answer[0], source(answer)) == (status, DATABASE if case != "accept html" else BATCH)
    if status == 405:
        assert answer[1]["allow"] == "POST"
    if status == 401:
        assert answer[1]["www-authenticate"] == "Bearer"


def test_another_path_is_not_the_routes(agents, first):
    assert posted(agents[0], body_of(first), path=REPORTS + "/")[0] == HANDED_ON


def test_with_tasks_inline_every_report_is_answered_alone(agents, first, monkeypatch):
    """Embedded mode runs a report's rollout reconcile in its request: in a batch it
    would hold every other report of the process."""
    monkeypatch.setitem(celery_app.conf, "task_always_eager", True)

    answer = posted(agents[0], body_of(first))

    assert (answer[0], source(answer)) == (201, DATABASE)


def test_a_body_in_many_parts_is_read_whole(agents, first):
    body = body_of(first, message="m" * 300)
    parts = [body[i:i + 7] for i in range(0, len(body), 7)]
    messages = [{"type": "http.request", "body": part, "more_body": i < len(parts) - 1}
                for i, part in enumerate(parts)]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    with thread_hops_on_the_tests_thread():
        async_to_sync(route.answer_report)(scope_of(agents[0], body), receive, send)

    assert sent[0]["status"] == 201
    assert agents[0].fresh().last_message == "m" * 300


def test_a_database_failure_leaves_the_batch_to_be_answered_alone(agents, first, monkeypatch):
    def failing(reports):
        raise OperationalError("connection refused")
    monkeypatch.setattr(route, "reports_intake", failing)

    answer = posted(agents[0], body_of(first))

    assert (answer[0], source(answer)) == (201, DATABASE)
    assert agents[0].fresh().applied_number == first.number


def test_concurrent_reports_are_recorded_in_one_batch(agents, first, monkeypatch):
    batches = []
    original = route.reports_intake

    def counted(reports):
        batches.append(len(reports))
        return original(reports)
    monkeypatch.setattr(route, "reports_intake", counted)

    async def one(agent):
        body = body_of(first)
        start, _ = await asgi_answer(route.answer_report, scope_of(agent, body), body)
        return start["status"]

    async def all_at_once():
        return await asyncio.gather(*(one(a) for a in agents))

    with thread_hops_on_the_tests_thread():
        statuses = async_to_sync(all_at_once)()

    assert statuses == [201] * 3 and batches == [3]
    assert {a.fresh().applied_number for a in agents} == {first.number}


def test_a_token_rotated_while_its_report_arrives_is_401(agents, first, superuser):
    agent = agents[0]
    body = body_of(first)
    messages = [{"type": "http.request", "body": body, "more_body": False}]
    sent = []

    async def receive():  # the body trickles in while the token is rotated
        if messages:
            await sync_to_async(enrollment.agent_token_rotate)(agent=agent.agent,
                                                               actor=superuser)
            return messages.pop(0)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    with thread_hops_on_the_tests_thread():
        async_to_sync(route.answer_report)(scope_of(agent, body), receive, send)

    assert sent[0]["status"] == 401
    assert not Deployment.objects.filter(agent=agent.agent).exists()


def test_reports_waiting_on_a_loop_gone_leave_the_next_loops_answered(agents, first):
    def recorded(agent):
        return route.batch_recorded(agent.agent.pk, agent.agent.token_key, body_of(first))
    gone = asyncio.new_event_loop()
    gone.create_task(recorded(agents[0]))
    gone.call_soon(gone.stop)
    gone.run_forever()  # its report waits for a writer that never runs
    gone.close()

    async def on_the_next_loop():
        return await asyncio.wait_for(recorded(agents[1]), 5)

    with thread_hops_on_the_tests_thread():
        assert async_to_sync(on_the_next_loop)().status_code == 201


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


def test_a_report_naming_another_agents_push_locks_nothing_of_it(agents, first, superuser):
    [push] = releases.snapshot_deploy(snapshot=first, agent_ids=[agents[1].agent.pk],
                                      actor=superuser)
    report = reports.Report(agents[0].agent.pk, push.pk, first.number, first.checksum,
                            "succeeded")

    with transaction.atomic():
        found = reports._Found([report])
        [result] = reports.reports_record([report])

    assert found.pushes == {} and result.status == 404


@pytest.mark.parametrize(("body", "field"), [
    (b'{"deployment_id": 5, "snapshot": 1, "checksum": "x", "status": "failed"}',
     "deployment_id"),
    (b'{"snapshot": 1' + b"9" * 5000 + b', "checksum": "x", "status": "failed"}', None),
    (b'{"snapshot": 1, "checksum": "x", "status": "failed", "message": "\xe9"}', None),
])
def test_a_number_for_an_id_a_number_too_long_or_not_utf8_is_a_clear_400(agents, body, field):
    answer = posted(agents[0], body)

    error = json.loads(answer[2])["error"]
    assert answer[0] == 400, error
    assert "int_max_str_digits" not in error["message"] and "codec" not in error["message"]
    if field:
        assert error["details"][0]["field"] == field


@pytest.mark.parametrize(("header", "status", "field"), [
    (("transfer-encoding", "gzip, chunked"), 400, "Transfer-Encoding"),
    (("content-encoding", "gzip"), 415, "Content-Encoding"),
    (("content-encoding", "identity"), 201, None),
])
def test_a_body_in_a_coding_nothing_decodes_is_refused_naming_the_header(agents, first,
                                                                       header, status, field):
    answer = posted(agents[0], body_of(first), headers=[header])

    assert answer[0] == status
    if field:
        assert json.loads(answer[2])["error"]["details"][0]["field"] == field
        assert not Deployment.objects.filter(agent=agents[0].agent).exists()
