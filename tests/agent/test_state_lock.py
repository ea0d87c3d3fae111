"""One agent per state directory, with real agent processes: the agent holds a lock
(flock on <state-dir>/lock) for as long as it runs; a second agent on the same
state directory exits 2 naming the first. The lock is the kernel's, so a lock file
left by a dead agent, or held open by nothing but a command it started, never
blocks the next one."""

from __future__ import annotations

import contextlib
import os
import signal

import pytest

from agent.runner import EXIT_CONFIG, EXIT_OK
from tests.agent.support import AgentProcess, make_bundle, pids_in_file, script, text_tree

pytestmark = pytest.mark.processes

V1 = {"nginx.conf": "worker_processes 2;\n"}
V2 = {"nginx.conf": "worker_processes 4;\n"}


@pytest.fixture
def agents(host, server):
    started = []

    def start(*args, name="web-1", target=None) -> AgentProcess:
        root = host.tmp_path / f"agent-{len(started)}"
        root.mkdir()
        agent = AgentProcess(["--server", server.url, "--token", server.token,
                              "--target-dir", str(target or host.target), "--state-dir",
                              str(host.state_dir), "--name", name, *args], root)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.kill()


def test_a_second_agent_on_the_same_state_dir_exits_2_naming_the_first(
        host, server, agents):
    server.publish(make_bundle(1, V1))
    first = agents("--poll-interval", "60")
    first.wait_for_log("reported #1 succeeded")
    other_target = host.tmp_path / "other-target"

    second = agents("--once", name="web-2", target=other_target)

    assert second.wait() == EXIT_CONFIG
    message = second.log().strip()
    assert message == (f"python -m agent: --state-dir {host.state_dir} is in use by "
                       f"another agent (pid {first.pid}, web-1); each agent needs a state "
                       "directory of its own")
    assert second.stdout() == ""
    assert not other_target.exists() or list(other_target.iterdir()) == []
    assert len(server.calls("desired")) == 1  # the second one asked the server nothing
    assert first.process.poll() is None  # the first goes on
    lock = host.state_dir / "lock"
    assert oct(os.stat(lock).st_mode & 0o777) == oct(0o600)


def test_the_lock_names_the_name_the_agent_enrolled_with(host, server, agents):
    server.publish(make_bundle(1, V1))
    enrolled = AgentProcess(["--once", "--server", server.url, "--enrollment-token",
                             server.ENROLLMENT_TOKEN, "--name", "web-7", "--target-dir",
                             str(host.target), "--state-dir", str(host.state_dir)],
                            host.tmp_path)
    assert enrolled.wait() == EXIT_OK, enrolled.log()
    (host.tmp_path / "named").mkdir()
    env_named = AgentProcess(["--poll-interval", "60", "--server", server.url,
                              "--target-dir", str(host.target), "--state-dir",
                              str(host.state_dir)], host.tmp_path / "named")
    try:
        env_named.wait_for_log("polling")
        second = agents("--once", name="web-2")

        assert second.wait() == EXIT_CONFIG
        assert f"(pid {env_named.pid}, web-7)" in second.log()
    finally:
        env_named.kill()


def test_a_lock_file_left_by_a_killed_agent_does_not_block_the_next(host, server, agents):
    server.publish(make_bundle(1, V1))
    first = agents("--poll-interval", "60")
    first.wait_for_log("reported #1 succeeded")
    first.process.send_signal(signal.SIGKILL)
    first.wait()
    assert str(first.pid) in (host.state_dir / "lock").read_text()  # left behind
    server.publish(make_bundle(2, V2))

    second = agents("--once")

    assert second.wait() == EXIT_OK, second.log()
    assert text_tree(host.target) == V2
    assert str(second.pid) in (host.state_dir / "lock").read_text()


def test_a_lock_file_of_another_program_or_garbage_does_not_block(host, server, agents):
    server.publish(make_bundle(1, V1))
    host.state_dir.mkdir()
    (host.state_dir / "lock").write_text(f"{os.getpid()} not an agent\n\0garbage")

    second = agents("--once")

    assert second.wait() == EXIT_OK, second.log()
    assert text_tree(host.target) == V1


def test_a_command_outliving_a_killed_agent_does_not_hold_the_lock(host, server, agents):
    """SIGKILL gives the agent no chance to end its command; the command does not
    inherit the lock, so the next agent starts (and restores the files)."""
    host.applier().apply(make_bundle(1, V1), host.load_state())
    server.publish(make_bundle(2, V2))
    pid_file = host.tmp_path / "validate.pids"
    slow = script(host.tmp_path, "slow.sh", f'echo $$ > "{pid_file}"\nexec sleep 300\n')
    first = agents("--validate-command", slow)
    (command,) = pids_in_file(pid_file, 1)
    try:
        first.process.send_signal(signal.SIGKILL)
        first.wait()

        second = agents("--once", "--validate-command", "true")

        assert second.wait() == EXIT_OK, second.log()
        assert "an apply of #2 was interrupted; restored the previous files" in second.log()
        assert text_tree(host.target) == V2
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(command, signal.SIGKILL)
