"""The agent node's process (`python -m project.pollnode`, docs/operations.md "A pool
for the agents") as an operator meets it: a worker that dies is replaced while the
node keeps answering, held long-polls included; SIGTERM stops the node and its
workers at once. Its HTTP is tested in tests/core/test_pollnode.py, the
application it serves in tests/e2e/test_production_server.py (run against it)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests import factories
from tests.e2e.harness import Server, free_port, wait_for
from tests.e2e.test_production_server import SERVER_SECRET_KEY, get

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def node(processes, server_environ, tmp_path, empty_cache) -> Server:
    environ = {**server_environ, "REDIS_URL": os.environ["REDIS_URL"], "DEBUG": "0",
               "SECRET_KEY": SERVER_SECRET_KEY, "SECURE_COOKIES": "0"}
    server = Server.poll_node(port=free_port(), env=environ, log_path=tmp_path / "node.log",
                              workers=2)
    processes.append(server)
    return server.start().wait_ready()


def workers(server: Server) -> set[int]:
    children = Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children")
    return {int(pid) for pid in children.read_text().split()}


def test_a_dead_worker_is_replaced_and_the_node_keeps_answering(node, environment, first,
                                                                superuser):
    agent = factories.enrolled_agent(environment, actor=superuser)
    auth = {"Authorization": f"Bearer {agent.token}"}
    status, headers, _ = get(node, "/api/v1/agent/desired", auth)
    assert status == 200
    held = {**auth, "If-None-Match": headers["ETag"]}
    before = workers(node)
    assert len(before) == 2

    killed = min(before)
    os.kill(killed, signal.SIGKILL)
    replaced = wait_for(lambda: (len(workers(node)) == 2 and killed not in workers(node),
                                 workers(node)), what="a new worker", timeout=20)
    assert replaced - before and f"worker {killed} exited" in node.log()
    answers = [get(node, "/api/v1/agent/desired?wait=1", held)[0] for _ in range(6)]
    assert answers == [304] * 6  # the node holds and answers with the new worker in place


def test_sigterm_stops_the_node_and_its_held_polls_at_once(node, environment, first,
                                                           superuser):
    agent = factories.enrolled_agent(environment, actor=superuser)
    auth = {"Authorization": f"Bearer {agent.token}"}
    etag = get(node, "/api/v1/agent/desired", auth)[1]["ETag"]
    answered = []

    def poll():
        try:
            answered.append(get(node, "/api/v1/agent/desired?wait=60",
                                {**auth, "If-None-Match": etag}))
        except Exception as exc:  # noqa: BLE001 - the connection closed: what is expected
            answered.append(exc)

    poller = threading.Thread(target=poll)
    poller.start()
    time.sleep(1)  # held by now
    children = workers(node)

    started = time.monotonic()
    node.process.send_signal(signal.SIGTERM)
    assert node.process.wait(10) == 0
    assert time.monotonic() - started < 5
    poller.join(10)
    assert not poller.is_alive()  # the held poll's connection was closed: it polls elsewhere
    assert isinstance(answered[0], Exception), answered
    for pid in children:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(
            f"/proc/{pid}/status").read_text()
