"""The shipped nginx site (deploy/nginx/bellwether.conf) end to end, as the file
is, with its placeholders filled in: TLS (a certificate made for the test), plain
HTTP redirected to HTTPS, the agents' API (`/api/v1/agent/`) routed to an agent node
(two granian workers) and every other request to an app node (one), as in
docs/operations.md "A pool for the agents"; real agents talk to nginx only. The
agents converge on each published snapshot, every agent request reached the agent
node and nothing else did, the live websocket opens through the proxy, and an
oversized body is refused by nginx.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from functools import partial
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.test import override_settings

from tests import factories
from tests.deployfiles import certificate, site_filled
from tests.e2e.harness import Server, free_port, wait_for, wait_in_sync
from tests.e2e.test_production_server import SERVER_SECRET_KEY, websocket_handshake

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

AGENT_API = "/api/v1/agent/"


@pytest.fixture
def server(processes, server_environ, make_nginx, tmp_path, empty_cache, monkeypatch):
    """nginx in front of an agent node (two workers) and an app node (one), both
    as deploy/systemd runs them; what make_fleet's agents and API client talk to."""
    environ = {**server_environ, "REDIS_URL": os.environ["REDIS_URL"], "DEBUG": "0",
               "SECRET_KEY": SERVER_SECRET_KEY, "BELLWETHER_PROXY_COUNT": "1"}
    nodes = {}
    for role, start in (("agents", partial(Server.production, workers=2)),
                        ("app", Server.production)):
        node = start(port=free_port(), env=environ, log_path=tmp_path / f"{role}.log")
        processes.append(node)
        nodes[role] = node.start().wait_ready()
    cert, key = certificate(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", cert)  # this process and the agents trust it
    https, http, site = free_port(), free_port(), tmp_path / "bellwether.conf"
    route_log = tmp_path / "route.log"
    site.write_text(site_filled(https=https, http=http, agents=nodes["agents"].port,
                                app=nodes["app"].port, cert=cert, key=key, log=route_log))
    nginx = make_nginx(site, https)
    started = subprocess.run(nginx.start_command, shell=True, capture_output=True, text=True,
                             timeout=30)
    assert started.returncode == 0, started.stderr
    return SimpleNamespace(url=f"https://127.0.0.1:{https}", port=https, http_port=http,
                           nodes=nodes, route_log=route_log,
                           tls=ssl.create_default_context(cafile=cert))


LOGGED = re.compile(r'"(\S+) (\S+) [^"]*" (\d+) .* upstream=(\S+)$')


def routed(server) -> list[tuple[str, str, str, int]]:
    """(method, path, status, upstream port) of every request nginx passed on."""
    found = [LOGGED.search(line) for line in server.route_log.read_text().splitlines()]
    return [(m[1], m[2], m[3], int(m[4].rsplit(":", 1)[1])) for m in found
            if m and m[4] != "-"]


def test_agents_go_to_their_pool_and_converge_through_the_proxy(server, make_fleet):
    fleet = make_fleet("message: one\n", {"app.conf": "message = {{ message }}\n"})
    assert fleet.api.publish()["number"] == 1
    names = ["pooled-1", "pooled-2"]
    for name in names:
        fleet.start_agent(name)
    wait_in_sync(fleet, names, 1, timeout=60)
    fleet.change_config("message: two\n")
    assert fleet.api.publish()["number"] == 2
    wait_in_sync(fleet, names, 2, timeout=60)

    requests = routed(server)
    agents_port, app_port = server.nodes["agents"].port, server.nodes["app"].port
    agents = [r for r in requests if r[1].startswith(AGENT_API)]
    others = [r for r in requests if not r[1].startswith(AGENT_API)]
    assert {port for *_, port in agents} == {agents_port}, agents
    # Each agent enrolled, polled, fetched both bundles and reported both there.
    assert {path for _, path, _, _ in agents} >= {
        "/api/v1/agent/enroll", "/api/v1/agent/desired", "/api/v1/agent/snapshots/1/bundle",
        "/api/v1/agent/snapshots/2/bundle", "/api/v1/agent/reports"}
    assert {status for _, _, status, _ in agents} <= {"200", "201", "304"}, agents
    # The operator's API (the publishes) went to the app node.
    assert others and {port for *_, port in others} == {app_port}, others


def test_the_live_websocket_opens_through_the_proxy(server, superuser):
    with override_settings(SECRET_KEY=SERVER_SECRET_KEY):  # the session as the server signs it
        session = factories.session_client(superuser).cookies[
            settings.SESSION_COOKIE_NAME].value

    opened = websocket_handshake(server, cookie=session, origin=server.url, tls=server.tls)
    elsewhere = websocket_handshake(server, cookie=session, origin="https://evil.example",
                                    tls=server.tls)

    assert b" 101 " in opened, opened
    assert b" 403 " in elsewhere, elsewhere

    def both_logged():  # nginx logs an upgraded connection once it closes
        ports = [port for _, path, _, port in routed(server) if path == "/ws/live/"]
        return len(ports) == 2, ports
    assert wait_for(both_logged, what="both handshakes in nginx's log", timeout=10) == [
        server.nodes["app"].port] * 2


def test_plain_http_is_redirected_and_an_oversized_body_refused_by_nginx(server):
    plain = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    with plain:
        plain.sendall(b"GET /api/v1/agent/desired HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                      b"Connection: close\r\n\r\n")
        head = plain.recv(4096).decode("latin-1")
    assert head.startswith("HTTP/1.1 301 "), head
    assert "\r\nLocation: https://127.0.0.1/api/v1/agent/desired\r\n" in head, head

    request = urllib.request.Request(server.url + "/api/v1/agent/reports", method="POST",
                                     data=b"x" * (2 * 1024 * 1024),
                                     headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 413
    assert not [r for r in routed(server) if r[1] == "/api/v1/agent/reports"]
