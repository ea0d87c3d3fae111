"""End to end against the production shape (README "Production shape"): granian serving
project.asgi with Redis as the cache and DEBUG off. The agents' routes are answered
in front of Django (agentapi), from the cache or from the database; everything else
reaches Django."""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.conf import settings
from django.test.utils import override_settings

from apps.fleet import enrollment
from apps.fleet import services as fleet_services
from apps.fleet.models import Agent, Deployment
from apps.releases import retention
from apps.releases.services import agent_decommission, environment_update
from tests import factories
from tests.e2e.harness import Server, free_port, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

FAILED_AUTH_LIMIT = 5
SERVER_SECRET_KEY = "e2e-production-" + "s" * 50


@pytest.fixture
def production(processes, server_environ, tmp_path, empty_cache) -> Server:
    """The server, with the failed-authentication counts of earlier runs gone (its
    readiness probe is one failed authentication itself)."""
    environ = {**server_environ, "REDIS_URL": os.environ["REDIS_URL"], "DEBUG": "0",
               "SECRET_KEY": SERVER_SECRET_KEY, "SECURE_COOKIES": "0",
               "BELLWETHER_THROTTLE_FAILED_AUTH": f"{FAILED_AUTH_LIMIT}/minute"}
    server = Server.production(port=free_port(), env=environ, log_path=tmp_path / "server.log")
    processes.append(server)
    return server.start().wait_ready()


def get(server: Server, path: str, headers: dict):
    request = urllib.request.Request(server.url + path, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers, exc.read()


@pytest.fixture
def agent(environment, first, superuser):
    return factories.enrolled_agent(environment, actor=superuser)


def test_the_poll_is_200_then_304_and_a_revoked_token_is_refused_at_once(
        production, agent, superuser):
    auth = {"Authorization": f"Bearer {agent.token}"}
    status, headers, body = get(production, "/api/v1/agent/desired", auth)
    assert status == 200, body
    etag = headers["ETag"]

    for header in (etag, f'"other", {etag}', f"W/{etag}", "*"):
        status, headers, body = get(production, "/api/v1/agent/desired",
                                    {**auth, "If-None-Match": header})
        assert (status, headers["ETag"], body) == (304, etag, b"")
    malformed, _, body = get(production, "/api/v1/agent/desired",
                             {**auth, "If-None-Match": etag.strip('"')})
    assert malformed == 200 and b'"snapshot"' in body

    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)
    status, _, body = get(production, "/api/v1/agent/desired", {**auth, "If-None-Match": etag})
    assert status == 401 and b'"authentication_failed"' in body


def test_a_bundle_kept_is_answered_as_the_database_answers_and_refused_once_revoked(
        production, agent, first, superuser):
    """The bundle route (agentapi/bundle.py) answers from the bytes it keeps what it
    answers from the database (a query string takes that path): the same bytes and
    headers; a revoked token is refused from its next request."""
    auth = {"Authorization": f"Bearer {agent.token}", "Accept-Encoding": "gzip"}
    assert get(production, "/api/v1/agent/desired", auth)[0] == 200  # its poll state
    url = f"/api/v1/agent/snapshots/{first.number}/bundle"

    answers = [get(production, url, auth) for _ in range(3)]
    etag = f'"{first.checksum}+gzip"'
    not_modified = [get(production, url, {**auth, "If-None-Match": etag}) for _ in range(2)]

    from_database = get(production, url + "?from=database", auth)

    def shown(answer):  # what is not per request (the date, the request id), in any order
        status, headers, body = answer
        return status, sorted((n.lower(), v) for n, v in headers.items()
                              if n.lower() not in ("date", "x-request-id")), body

    assert answers[0][0] == 200 and answers[0][1]["Content-Encoding"] == "gzip"
    assert gzip.decompress(answers[0][2]) == bytes(first.bundle)
    assert shown(answers[0]) == shown(answers[1]) == shown(answers[2]) == shown(from_database)
    assert not_modified[0][0] == 304 and shown(not_modified[0]) == shown(not_modified[1])
    assert "X-Request-ID" in from_database[1]
    assert not any("X-Request-ID" in a[1] for a in answers)  # kept: no request of its own

    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)
    status, _, body = get(production, url, auth)
    assert status == 401 and b'"authentication_failed"' in body


@pytest.fixture
def another_node(production, processes, tmp_path) -> Server:
    """A second node of the same deployment (the same database, cache and settings)."""
    node = Server.production(port=free_port(), env=production.env,
                             log_path=tmp_path / "another.log")
    processes.append(node)
    return node.start().wait_ready()


def test_a_removed_snapshot_is_404_on_every_node_from_the_next_request(
        production, another_node, agent, environment, first, superuser):
    """Each node served #1 while the agent desired it; once the environment moved on
    and an owner removed #1, its bundle is 404 on both, also with gzip."""
    auth = {"Authorization": f"Bearer {agent.token}", "Accept-Encoding": "gzip"}
    url = f"/api/v1/agent/snapshots/{first.number}/bundle"
    nodes = (production, another_node)
    for node in nodes:
        assert get(node, "/api/v1/agent/desired", auth)[0] == 200
        assert [get(node, url, auth)[0] for _ in range(2)] == [200, 200]
    factories.publish_variant(environment, superuser, workers=8)
    factories.publish_variant(environment, superuser, workers=9)

    retention.snapshot_remove(snapshot=first, actor=superuser, reason="leaked a hostname")

    for node in nodes:
        status, _, body = get(node, url, auth)
        assert status == 404 and b'"not_found"' in body, (node.label, status, body)


def _revoke(agent, superuser):
    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)


def _rotate(agent, superuser):
    agent.new_token = enrollment.agent_token_rotate(agent=agent.agent, actor=superuser)


def _decommission(agent, superuser):
    agent.agent.refresh_from_db()
    agent_decommission(
        agent=agent.agent, expected_generation=agent.agent.generation, actor=superuser)


def _polled_on_both(nodes, auth, bundle_url) -> str:
    """The agent's poll answered from each node's cache (304) and its bundle from
    each node's kept answer; its ETag."""
    etag = get(nodes[0], "/api/v1/agent/desired", auth)[1]["ETag"]
    gzipped = {**auth, "Accept-Encoding": "gzip"}
    for node in nodes:
        assert get(node, "/api/v1/agent/desired", {**auth, "If-None-Match": etag})[0] == 304
        assert [get(node, bundle_url, gzipped)[0] for _ in range(2)] == [200, 200]
    return etag


@pytest.mark.parametrize("change", [_revoke, _rotate, _decommission])
def test_a_token_refused_by_a_change_is_refused_on_every_node_from_its_next_request(
        production, another_node, agent, first, superuser, change):
    """The poll, bundle and report routes of both nodes refuse the old token from the
    first request after the change commits; a rotated token's new one is answered."""
    auth = {"Authorization": f"Bearer {agent.token}"}
    bundle_url = f"/api/v1/agent/snapshots/{first.number}/bundle"
    nodes = (production, another_node)
    etag = _polled_on_both(nodes, auth, bundle_url)

    change(agent, superuser)

    for node in nodes:
        status = get(node, "/api/v1/agent/desired", {**auth, "If-None-Match": etag})[0]
        assert status == 401, (node.label, status)
    if change is _rotate:
        new = {"Authorization": f"Bearer {agent.new_token}", "If-None-Match": etag}
        assert [get(node, "/api/v1/agent/desired", new)[0] for node in nodes] == [304, 304]
    for node in nodes:  # (past FAILED_AUTH_LIMIT failures the address is refused: 429)
        bundle = get(node, bundle_url, {**auth, "Accept-Encoding": "gzip"})
        report = post_report(node, agent.token, {
            "deployment_id": None, "snapshot": first.number, "checksum": first.checksum,
            "status": "succeeded", "message": "applied"})
        assert bundle[0] in (401, 429) and report[0] in (401, 429), (node.label, bundle, report)


ANSWER_CHANGES = [  # a change, and what the next poll on every node must then say
    (lambda agent, environment, superuser: factories.publish_variant(
        environment, superuser, workers=8), "snapshot", 2),
    (lambda agent, environment, superuser: fleet_services.agent_update(
        agent=agent.agent, actor=superuser, mode="manual"), "mode", "manual"),
    (lambda agent, environment, superuser: environment_update(
        environment=environment, actor=superuser, poll_interval_s=45), "poll_interval_s", 45),
    (lambda agent, environment, superuser: environment_update(
        environment=environment, actor=superuser, drift_policy="restore"),
     "drift_policy", "restore"),
]


def test_the_next_poll_on_every_node_answers_as_each_change_says(
        production, another_node, agent, environment, first, superuser):
    """Each node answers the agent's poll from its cache; the first poll on each after
    a change commits (a release, its mode, the poll interval, the drift policy)
    answers as the change says."""
    auth = {"Authorization": f"Bearer {agent.token}"}
    nodes = (production, another_node)
    etag = _polled_on_both(nodes, auth, f"/api/v1/agent/snapshots/{first.number}/bundle")
    for change, field, value in ANSWER_CHANGES:
        change(agent, environment, superuser)
        for node in nodes:
            status, headers, body = get(node, "/api/v1/agent/desired",
                                        {**auth, "If-None-Match": etag})
            answer = json.loads(body) if status == 200 else {}
            said = answer.get(field)
            said = said["number"] if field == "snapshot" and said else said
            assert said == value, (node.label, status, body)
        etag = headers["ETag"]


def post_report(server: Server, token: str, report: dict):
    request = urllib.request.Request(
        server.url + "/api/v1/agent/reports", data=json.dumps(report).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_reports_sent_at_once_are_recorded_in_batches_and_refusals_answered_alone(
        production, environment, first, superuser):
    """Twenty agents report at the same moment: the reports route records them in
    batches; a report a batch refuses is answered from the database, 400 with the
    envelope, and writes nothing."""
    agents = [factories.enrolled_agent(environment, f"web-{i}", actor=superuser)
              for i in range(21)]
    for enrolled in agents:  # the poll state that vouches for their tokens
        assert get(production, "/api/v1/agent/desired",
                   {"Authorization": f"Bearer {enrolled.token}"})[0] == 200
    report = {"deployment_id": None, "snapshot": first.number, "checksum": first.checksum,
              "status": "succeeded", "message": "applied"}
    assert post_report(production, agents[0].token, report)[0] == 201
    answers = {}

    def send(enrolled):
        answers[enrolled.agent.pk] = post_report(production, enrolled.token, report)

    threads = [threading.Thread(target=send, args=(a,)) for a in agents[1:]]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    refused = post_report(production, agents[1].token, {**report, "checksum": "sha256:x"})
    again = post_report(production, agents[1].token, report)

    assert {status for status, _ in answers.values()} == {201}, answers
    assert all(body["duplicate"] is False and body["state"] == "succeeded"
               for _, body in answers.values())
    assert refused[0] == 400 and refused[1]["error"]["code"] == "checksum_mismatch"
    assert again[0] == 200 and again[1]["duplicate"] is True
    assert Deployment.objects.filter(agent__environment=environment).count() == 21
    assert Agent.objects.filter(environment=environment, applied_number=first.number,
                                last_message="applied").count() == 21


def test_the_poll_records_the_heartbeat(production, agent):
    auth = {"Authorization": f"Bearer {agent.token}"}
    _, headers, _ = get(production, "/api/v1/agent/desired", auth)
    for _ in range(5):
        get(production, "/api/v1/agent/desired", {**auth, "If-None-Match": headers["ETag"]})

    def seen():
        from apps.fleet import cache

        known = cache.heartbeats([agent.agent.pk])
        return agent.agent.pk in known, known

    wait_for(seen, what="the poll's heartbeat in the cache")


def test_bad_tokens_on_the_poll_are_401_with_the_envelope_and_counted(production, agent):
    auth = {"Authorization": f"Bearer {agent.token}"}
    _, headers, _ = get(production, "/api/v1/agent/desired", auth)
    matching = {**auth, "If-None-Match": headers["ETag"]}
    assert get(production, "/api/v1/agent/desired", matching)[0] == 304
    bad = ["bwa_nope.nope", "bwu_x.y", f"{agent.token}x", "bwa_", agent.token.upper(),
           "bwa_zz.zz"]
    answers = []
    for presented in bad:  # only refused credentials count (not the tokenless probe)
        status, _, body = get(production, "/api/v1/agent/desired",
                              {"If-None-Match": headers["ETag"],
                               "Authorization": f"Bearer {presented}"})
        answers.append(status)
        if status == 429:
            break
        assert status == 401 and b'"authentication_failed"' in body, body
    assert answers == [401] * FAILED_AUTH_LIMIT + [429]

    # The address is refused now, its valid agent token and cached 304 included.
    status, retry, body = get(production, "/api/v1/agent/desired", matching)
    assert status == 429 and b'"throttled"' in body and retry["Retry-After"]


def test_a_long_poll_is_held_and_woken_by_a_change_committed_elsewhere(
        production, agent, environment, superuser):
    """The change commits in this test process — another node, for the server — and
    is announced through Redis; the held poll answers 200 with the new state."""
    auth = {"Authorization": f"Bearer {agent.token}"}
    status, headers, _ = get(production, "/api/v1/agent/desired", auth)
    assert status == 200 and headers["Bellwether-Long-Poll"] == "60"
    etag = headers["ETag"]
    held = {**auth, "If-None-Match": etag}

    started = time.monotonic()
    status, headers, _ = get(production, "/api/v1/agent/desired?wait=1", held)
    assert (status, headers["ETag"], headers["Bellwether-Long-Poll"]) == (304, etag, "60")
    assert 0.9 <= time.monotonic() - started < 5

    answer = {}
    poller = threading.Thread(target=lambda: answer.update(zip(
        ("status", "headers", "body", "at"),
        (*get(production, "/api/v1/agent/desired?wait=30", held), time.monotonic()),
        strict=True)))
    poller.start()
    time.sleep(1.0)  # the poll is held by now
    changed_at = time.monotonic()
    environment_update(environment=environment, poll_interval_s=17, actor=superuser)
    poller.join(40)

    assert answer["status"] == 200, (answer, answer["at"] - changed_at, production.log()[-3000:])
    assert answer["headers"]["ETag"] != etag
    assert json.loads(answer["body"])["poll_interval_s"] == 17
    assert answer["at"] - changed_at < 3


def test_a_bad_wait_is_400_naming_wait_on_the_production_server(production, agent):
    auth = {"Authorization": f"Bearer {agent.token}", "If-None-Match": '"x"'}
    for wait in ("abc", "-1", "1.5"):
        status, _, body = get(production, f"/api/v1/agent/desired?wait={wait}", auth)
        assert status == 400 and json.loads(body)["error"]["details"][0]["field"] == "wait"


def websocket_handshake(server: Server, *, cookie: str | None, origin: str,
                        tls: ssl.SSLContext | None = None) -> bytes:
    """The status line the server answers a websocket upgrade of /ws/live/ with
    (over TLS with `tls`)."""
    head = (f"GET /ws/live/ HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
            f"Sec-WebSocket-Version: 13\r\nOrigin: {origin}\r\n"
            + (f"Cookie: {settings.SESSION_COOKIE_NAME}={cookie}\r\n" if cookie else "")
            + "\r\n")
    # Generous: the first socket of a fresh worker sets up the channel layer, slow on
    # a loaded machine.
    with contextlib.ExitStack() as stack:
        sock = stack.enter_context(socket.create_connection(("127.0.0.1", server.port),
                                                            timeout=30))
        if tls is not None:
            sock = stack.enter_context(tls.wrap_socket(sock, server_hostname="127.0.0.1"))
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    return answer.split(b"\r\n", 1)[0]


def test_the_live_websocket_opens_for_a_session_and_is_refused_without(production, superuser):
    with override_settings(SECRET_KEY=SERVER_SECRET_KEY):  # the session as the server signs it
        client = factories.session_client(superuser)
    session = client.cookies[settings.SESSION_COOKIE_NAME].value
    origin = production.url

    anonymous = websocket_handshake(production, cookie=None, origin=origin)
    elsewhere = websocket_handshake(production, cookie=session, origin="http://evil.example")
    opened = websocket_handshake(production, cookie=session, origin=origin)

    assert b" 101 " in opened, opened
    assert b" 101 " not in anonymous and b" 101 " not in elsewhere, (anonymous, elsewhere)
