"""End to end: a change committed while Redis is stalled reaches every agent within
a poll interval.

Two server processes share the test database and a private Redis of the test's own
(their cache, broker and channel layer), as two web nodes do in production. Six
real agents poll node B. Redis is stopped (SIGSTOP) while node A activates an
already published snapshot (committed while Redis is stopped: its cache drop and
live events wait or fail); node A is killed before Redis answers again (whatever
it kept in memory to retry is gone); then Redis resumes. Node B must answer the
agents the new snapshot at once: the agents' cached ETags are not trusted while
the change's invalidation is unsettled in the database.
"""

from __future__ import annotations

import contextlib
import shutil
import threading
import time

import pytest

from apps.environments.models import Environment
from apps.releases.services import environment_update
from tests.e2e.harness import Api, Server, free_port, http_json, wait_for, wait_in_sync
from tests.faults.conftest import PrivateRedis

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TEMPLATES = {"app/settings.conf": "message = {{ message }}\nworkers = {{ workers }}\n"}
NAMES = [f"web-{i}" for i in range(1, 7)]
STALL_S = 2.3  # the stall seen in production during an activation


def config(message: str, workers: int) -> str:
    return f"message: {message}\nworkers: {workers}\n"


@pytest.fixture
def stallable_redis(tmp_path):
    if shutil.which("redis-server") is None:
        import os

        message = "needs redis-server on PATH for a private Redis"
        if os.environ.get("BELLWETHER_REQUIRE_SERVICES") == "1":
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)
    directory = tmp_path / "redis"
    directory.mkdir()
    server = PrivateRedis(directory)
    yield server
    server.terminate()


@pytest.fixture
def server_environ(server_environ, stallable_redis):
    """Every server of this module uses the private Redis (cache, broker, channels)."""
    return {**server_environ, "REDIS_URL": stallable_redis.url, "REDIS_TIMEOUT_S": "2"}


def active_number(environment) -> int | None:
    active = Environment.objects.select_related("active_snapshot").get(
        pk=environment.pk).active_snapshot
    return None if active is None else active.number


def test_an_activation_during_a_redis_stall_reaches_every_agent_within_a_poll_interval(
        make_fleet, server_environ, processes, stallable_redis, tmp_path):
    fleet = make_fleet(config("hello v1", workers=2), TEMPLATES)
    node_a = Server(port=free_port(), env=server_environ, log_path=tmp_path / "node-a.log")
    processes.append(node_a)
    node_a.start().wait_ready()
    api_a = Api(node_a, fleet.api.token, fleet.environment.application.name,
                fleet.environment.name)
    assert api_a.publish()["number"] == 1
    for name in NAMES:
        fleet.start_agent(name)  # they poll node B, the `server` fixture
    wait_in_sync(fleet, NAMES, 1, timeout=40.0)
    # #2 is published, not active (the environment requires activation).
    environment_update(environment=fleet.environment, release_policy="staged",
                       actor=fleet.actor)
    fleet.change_config(config("hello v2", workers=8))
    assert api_a.publish()["number"] == 2
    time.sleep(2)  # steady: the agents' polls are answered 304 from Redis
    assert active_number(fleet.environment) == 1

    def activate():  # node A is stopped before it answers, by design
        with contextlib.suppress(OSError):
            http_json("POST", f"{node_a.url}{api_a.env_path}/snapshots/2/activate", {},
                      token=api_a.token, timeout=60)

    with stallable_redis.stalled():
        stalled_at = time.monotonic()
        threading.Thread(target=activate, daemon=True).start()
        wait_for(lambda: (active_number(fleet.environment) == 2,
                          active_number(fleet.environment)),
                 what="node A to commit the activation while Redis is stopped",
                 timeout=20.0, diagnostics=node_a.dump)
        time.sleep(max(0.0, STALL_S - (time.monotonic() - stalled_at)))
        # Node A dies before Redis answers again: whatever it meant to retry is gone.
        node_a.stop(timeout=0.1)
    resumed_at = time.monotonic()
    interval = fleet.environment.poll_interval_s

    # Every agent is told about #2 within a poll interval of Redis answering again
    # (they poll node B every second; applying and reporting take a moment more).
    def told():
        seen = {name: "applying #2" in fleet.agents[name].log() for name in NAMES}
        return all(seen.values()), seen

    wait_for(told, what="every agent to be told about #2", timeout=interval,
             diagnostics=fleet.logs)
    told_within = time.monotonic() - resumed_at
    agents = wait_in_sync(fleet, NAMES, 2, timeout=20.0)
    expected = fleet.api.snapshot_files(2)
    for name in NAMES:
        assert agents[name]["status"]["applied"]["number"] == 2
        assert fleet.agents[name].files() == expected
        assert fleet.agents[name].running()
    assert told_within < interval, told_within
