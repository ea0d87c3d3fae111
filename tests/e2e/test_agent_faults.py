"""End to end, the agent under faults against real server processes: failover
between two servers (and back to the first), a truncated state file that
neither stops the agent nor costs it its identity, and a stop (SIGTERM) during
a slow validation."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal

import pytest

from tests.agent.support import alive, pids_in_file
from tests.e2e.harness import AgentProcess, Api, Server, free_port, wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TEMPLATES = {"app/settings.conf": "message = {{ message }}\n"}


def config(message: str) -> str:
    return f"message: {message}\n"


def api_on(server: Server, api: Api) -> Api:
    """The same operator's API, on another server process."""
    other = Api(server, api.token, "", "")
    other.env_path = api.env_path
    return other


def test_the_agent_fails_over_to_the_second_server_and_goes_back_to_the_first(
        make_fleet, processes, server_environ, tmp_path):
    fleet = make_fleet(config("v1"), TEMPLATES)
    first = fleet.server
    second = Server(port=free_port(), env=server_environ, log_path=tmp_path / "second.log")
    processes.append(second)
    second.start().wait_ready()
    fleet.api.publish()
    agent = AgentProcess(name="web-1", server_url=f"{first.url},{second.url}",
                         root=fleet.root / "web-1", enrollment_token=fleet.enrollment_token)
    processes.append(agent)
    fleet.agents["web-1"] = agent
    agent.start()
    wait_in_sync(fleet, ["web-1"], 1)

    first.stop()
    fleet.api = api_on(second, fleet.api)
    fleet.change_config(config("v2"))
    fleet.api.publish()
    wait_in_sync(fleet, ["web-1"], 2)

    assert agent.files() == {"app/settings.conf": "message = v2\n"}
    assert "trying the next server" in agent.log()
    assert f"now using {second.url}" in agent.log()

    first.start().wait_ready()
    fleet.api = api_on(first, fleet.api)
    fleet.change_config(config("v3"))
    fleet.api.publish()
    wait_in_sync(fleet, ["web-1"], 3)
    wait_for(lambda: ("the first server answers again" in agent.log(), agent.log()[-400:]),
             what="the agent to go back to the first server")
    assert agent.running()


def test_a_truncated_state_file_is_moved_aside_and_the_agent_keeps_its_identity(make_fleet):
    fleet = make_fleet(config("v1"), TEMPLATES)
    fleet.api.publish()
    agent = fleet.start_agent("web-1")
    agent_id = wait_in_sync(fleet, ["web-1"], 1)["web-1"]["id"]
    agent.stop()
    state_file = agent.state_dir / "state.json"
    state_file.write_bytes(state_file.read_bytes()[:25])

    fleet.change_config(config("v2"))
    fleet.api.publish()
    agent.restart_without_enrollment_token()
    agents = wait_in_sync(fleet, ["web-1"], 2)

    assert agents["web-1"]["id"] == agent_id  # the same agent, no new enrollment
    assert "state.json is corrupt" in agent.log() and "moved it to" in agent.log()
    assert "Traceback" not in agent.log()
    assert agent.files() == {"app/settings.conf": "message = v2\n"}
    assert any(p.name.startswith("state.json.corrupt-") for p in agent.state_dir.iterdir())


def test_an_agent_stopped_during_a_slow_validation_ends_it_and_applies_after_a_restart(
        make_fleet, tmp_path):
    """As `systemctl stop` during a validation that hangs: the agent ends the
    command's process group and exits 143 with the old files live; started again,
    it applies the snapshot and the server sees it in sync."""
    fleet = make_fleet(config("v1"), TEMPLATES)
    fleet.api.publish()
    pid_file = tmp_path / "validate.pids"
    hang = tmp_path / "hang.sh"
    hang.write_text(f'case "$1" in *v2*) ;; *) exit 0;; esac\n'
                    f'echo $$ >> {shlex.quote(str(pid_file))}\n'
                    f'sleep 300 &\necho $! >> {shlex.quote(str(pid_file))}\nwait\n')
    validate = f'sh {shlex.quote(str(hang))} "$(cat {{staged}}/app/settings.conf)"'
    agent = fleet.start_agent("web-1", "--validate-command", validate)
    wait_in_sync(fleet, ["web-1"], 1)
    fleet.change_config(config("v2"))
    fleet.api.publish()
    pids = pids_in_file(pid_file, 2)
    try:
        code = agent.stop()

        assert code == 143, agent.log()[-2000:]
        assert [p for p in pids if alive(p)] == []
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert "SIGTERM received: stopping" in agent.log()
    assert "ended the validate command" in agent.log()
    assert agent.files() == {"app/settings.conf": "message = v1\n"}
    agent.extra_args = ["--validate-command", "test -f {staged}/app/settings.conf"]
    agent.restart_without_enrollment_token()
    wait_in_sync(fleet, ["web-1"], 2)
    assert agent.files() == {"app/settings.conf": "message = v2\n"}
