"""The agents in a pool of their own (docs/operations.md, "A pool for the agents"),
end to end: a real nginx routes the agents' API (`/api/v1/agent/`) to an agent
node (two granian workers) and every other request to an app node (one), as the
documented configuration does; real agents talk to nginx only. The agents
converge on each published snapshot, every agent request reached the agent node
and nothing else did, and the live websocket opens through the proxy.
"""

from __future__ import annotations

import os
import subprocess
from functools import partial
from types import SimpleNamespace

import pytest
from django.conf import settings
from django.test import override_settings

from tests import factories
from tests.e2e.harness import Server, free_port, wait_for, wait_in_sync
from tests.e2e.test_production_server import SERVER_SECRET_KEY, websocket_handshake

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

AGENT_API = "/api/v1/agent/"
# docs/operations.md's routing, with the test's ports and a log naming the upstream.
SITE = """map $http_upgrade $connection_upgrade {{ default upgrade; "" close; }}
upstream bellwether_agents {{ server 127.0.0.1:{agents}; }}
upstream bellwether_app {{ server 127.0.0.1:{app}; }}
log_format route '$request_method $uri $status $upstream_addr';
server {{
    listen 127.0.0.1:{port};
    access_log {log} route;
    proxy_http_version 1.1;
    proxy_set_header Host $http_host;
    proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    proxy_set_header X-Forwarded-Proto $scheme;
    proxy_set_header X-Request-ID $request_id;
    proxy_set_header Upgrade $http_upgrade;
    proxy_set_header Connection $connection_upgrade;
    location /api/v1/agent/ {{
        proxy_pass http://bellwether_agents;
        proxy_read_timeout 90s;
    }}
    location / {{
        proxy_pass http://bellwether_app;
    }}
}}
"""


@pytest.fixture
def server(processes, server_environ, make_nginx, tmp_path, empty_cache):
    """nginx in front of an agent node (two workers) and an app node (one), both
    granian as README runs it; what make_fleet's agents and API client talk to."""
    environ = {**server_environ, "REDIS_URL": os.environ["REDIS_URL"], "DEBUG": "0",
               "SECRET_KEY": SERVER_SECRET_KEY, "SECURE_COOKIES": "0",
               "BELLWETHER_PROXY_COUNT": "1"}
    nodes = {}
    for role, start in (("agents", partial(Server.production, workers=2)),
                        ("app", Server.production)):
        node = start(port=free_port(), env=environ, log_path=tmp_path / f"{role}.log")
        processes.append(node)
        nodes[role] = node.start().wait_ready()
    port, site = free_port(), tmp_path / "routing.conf"
    route_log = tmp_path / "route.log"
    site.write_text(SITE.format(agents=nodes["agents"].port, app=nodes["app"].port, port=port,
                                log=route_log))
    nginx = make_nginx(site, port)
    started = subprocess.run(nginx.start_command, shell=True, capture_output=True, text=True,
                             timeout=30)
    assert started.returncode == 0, started.stderr
    return SimpleNamespace(url=f"http://127.0.0.1:{port}", port=port, nodes=nodes,
                           route_log=route_log)


def routed(server) -> list[tuple[str, str, str, int]]:
    """(method, path, status, upstream port) of every request nginx passed on."""
    lines = server.route_log.read_text().splitlines()
    return [(method, path, status, int(upstream.rsplit(":", 1)[1]))
            for method, path, status, upstream in (line.split() for line in lines)]


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

    opened = websocket_handshake(server, cookie=session, origin=server.url)
    elsewhere = websocket_handshake(server, cookie=session, origin="http://evil.example")

    assert b" 101 " in opened, opened
    assert b" 403 " in elsewhere, elsewhere

    def both_logged():  # nginx logs an upgraded connection once it closes
        ports = [port for _, path, _, port in routed(server) if path == "/ws/live/"]
        return len(ports) == 2, ports
    assert wait_for(both_logged, what="both handshakes in nginx's log", timeout=10) == [
        server.nodes["app"].port] * 2
