"""SIGINT and SIGTERM with the real agent process: whatever it is doing — a
validate, reload or health command running, a poll held by the server, the sleep
between polls — it ends the running command's whole process group, logs that it
is stopping and exits 130 (SIGINT) or 143 (SIGTERM). Nothing it started survives
it, and an apply it was in the middle of is finished by the next start, as after a
crash (agent/apply.py recover_interrupted)."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import time

import pytest

from agent.apply import SUCCEEDED
from agent.runner import EXIT_OK
from tests.agent.conftest import Host
from tests.agent.support import (
    AgentProcess,
    alive,
    make_bundle,
    pids_in_file,
    script,
    temp_files,
    text_tree,
    wait_until,
)

pytestmark = pytest.mark.processes

V1 = {"nginx.conf": "worker_processes 2;\n", "old-only.conf": "only in #1\n",
      "conf.d/shop.conf": "listen 80;\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/shop.conf": "listen 8080;\n",
      "conf.d/deep/new-only.conf": "only in #2\n"}
EXIT_FOR = {signal.SIGINT: 130, signal.SIGTERM: 143}
# What a command gets to end on SIGTERM before SIGKILL (docs/agents.md, "Stopping").
GRACE_S = 5.0


def hanging(tmp_path, *, ignores_term: bool = False) -> tuple:
    """A command that never ends by itself: a shell with a child and a grandchild in
    its process group (with `ignores_term`, one that only SIGKILL ends), each
    writing its pid to a file. Returns (the command, the pid file)."""
    pids = tmp_path / "command.pids"
    stubborn = "(trap '' TERM; exec sleep 301) &\necho $! >> \"$PIDS\"\n" if ignores_term else ""
    command = script(tmp_path, "hang.sh",
                     f"PIDS={shlex.quote(str(pids))}\n"
                     'echo $$ >> "$PIDS"\n'
                     "sleep 300 &\n"
                     'echo $! >> "$PIDS"\n'
                     '(sleep 302 & echo $! >> "$PIDS"; wait) &\n'
                     f"{stubborn}"
                     "wait\n")
    return command, pids


@pytest.fixture
def agents(host, server):
    """Starts `python -m agent` (not --once) against the protocol server on `host`;
    after the test, kills what is left of the agents and of the commands whose pids
    were recorded (so a failure leaves nothing running)."""
    started, recorded = [], []

    def start(*args, on=host, umask=None) -> AgentProcess:
        agent = AgentProcess(["--server", server.url, "--token", server.token,
                              "--target-dir", str(on.target), "--state-dir",
                              str(on.state_dir), "--name", "web-1", *args],
                             on.tmp_path, umask=umask)
        started.append(agent)
        return agent

    start.recorded = recorded
    yield start
    for agent in started:
        agent.kill()
    for pid in recorded:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def send(agent: AgentProcess, signum: int) -> float:
    """SIGTERM as a service manager sends it (to the agent); SIGINT as a terminal's
    Ctrl-C does (to the agent's process group: its commands have groups of their
    own). Returns when it was sent."""
    if signum == signal.SIGINT:
        os.killpg(agent.pid, signum)
    else:
        os.kill(agent.pid, signum)
    return time.monotonic()


def assert_stopped(agent: AgentProcess, signum: int, sent: float, *, within: float = 5.0,
                   started=()):
    """The agent exited as `signum` says, within `within` seconds, saying so; and
    the processes `started` (its command's) are gone."""
    code = agent.wait(timeout=within + 10)
    took = time.monotonic() - sent
    assert_all_gone(started)
    assert code == EXIT_FOR[signum], (code, agent.log()[-2000:])
    assert took < within, f"took {took:.1f}s to stop"
    log = agent.log()
    assert f"{signal.Signals(signum).name} received: stopping" in log, log[-2000:]
    assert f"stopped (exit {EXIT_FOR[signum]})" in log, log[-2000:]
    assert "Traceback" not in log, log[-3000:]


def assert_all_gone(pids: list) -> None:
    """Every pid has ended; the agent has exited, so a member still dying gets a
    moment, not more."""
    deadline = time.monotonic() + 2.0
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [p for p in pids if alive(p)] == [], "processes the agent started survived it"


def on_v1(host, server):
    """#1 applied (in this process), #2 published."""
    host.applier().apply(make_bundle(1, V1), host.load_state())
    server.publish(make_bundle(2, V2))


# Where the hanging command is configured, and whether #2's files are live while it runs.
COMMANDS = {
    "validate staged": (lambda hang: ["--validate-command", f"{hang} {{staged}}"], False),
    "validate in place": (lambda hang: ["--validate-command", hang], True),
    "reload": (lambda hang: ["--validate-command", "true", "--reload-command", hang], True),
    "health command": (lambda hang: ["--reload-command", "true", "--health-command", hang,
                                     "--health-timeout", "60"], True),
}


COMMAND_NAMES = {"validate staged": "validate", "validate in place": "validate",
                 "reload": "reload", "health command": "probe"}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
@pytest.mark.parametrize("where", list(COMMANDS))
def test_a_signal_during_a_command_ends_its_process_group_and_the_agent(
        host, server, agents, where, signum):
    on_v1(host, server)
    hang, pid_file = hanging(host.tmp_path)
    options, new_files_live = COMMANDS[where]
    agent = agents(*options(hang))
    pids = pids_in_file(pid_file, 3)
    agents.recorded.extend(pids)

    sent = send(agent, signum)

    assert_stopped(agent, signum, sent, started=pids)
    assert f"ended the {COMMAND_NAMES[where]} command (pid" in agent.log()
    live = {p: c for p, c in text_tree(host.target).items() if ".bellwether-tmp-" not in p}
    if new_files_live:  # each file old or new; the next start puts #1's back
        assert live == V2 and host.load_state().in_progress["number"] == 2
        assert "the next start restores the previous files" in agent.log()
    else:  # nothing unvalidated went live, and the staged tree is gone
        assert live == V1 and temp_files(host.target) == []
        assert host.load_state().in_progress["number"] == 2


def test_once_says_it_was_stopped(host, server, agents):
    on_v1(host, server)
    hang, pid_file = hanging(host.tmp_path)
    agent = agents("--once", "--validate-command", f"{hang} {{staged}}")
    agents.recorded.extend(pids_in_file(pid_file, 3))

    assert_stopped(agent, signal.SIGTERM, send(agent, signal.SIGTERM))
    assert agent.stdout() == "web-1: stopped by SIGTERM\n"
    assert server.reports == []  # a stopped apply reports nothing; the next start does


def test_a_member_ignoring_sigterm_is_killed_once_the_command_has_exited(
        host, server, agents):
    on_v1(host, server)
    hang, pid_file = hanging(host.tmp_path, ignores_term=True)
    agent = agents("--validate-command", f"{hang} {{staged}}")
    pids = pids_in_file(pid_file, 4)
    agents.recorded.extend(pids)

    sent = send(agent, signal.SIGTERM)

    assert_stopped(agent, signal.SIGTERM, sent, within=3.0, started=pids)


@pytest.mark.slow
def test_a_command_ignoring_sigterm_is_killed_after_the_grace(host, server, agents):
    """The command is given GRACE_S to end on SIGTERM, then killed."""
    on_v1(host, server)
    hang, pid_file = hanging(host.tmp_path)
    agent = agents("--validate-command", f"trap '' TERM; {hang} {{staged}}")
    pids = pids_in_file(pid_file, 3)
    agents.recorded.extend(pids)

    sent = send(agent, signal.SIGTERM)

    assert_stopped(agent, signal.SIGTERM, sent, within=GRACE_S + 3, started=pids)
    assert time.monotonic() - sent >= GRACE_S - 0.5  # SIGTERM had its chance


@pytest.mark.parametrize("where", ["validate in place", "reload"])
def test_the_next_start_finishes_an_apply_a_signal_interrupted(host, server, agents, where):
    on_v1(host, server)
    hang, pid_file = hanging(host.tmp_path)
    agent = agents(*COMMANDS[where][0](hang))
    agents.recorded.extend(pids_in_file(pid_file, 3))
    assert_stopped(agent, signal.SIGTERM, send(agent, signal.SIGTERM))

    again = agents("--once", "--validate-command", "true", "--reload-command", "true")

    assert again.wait() == EXIT_OK, again.log()[-2000:]
    assert "an apply of #2 was interrupted; restored the previous files" in again.log()
    assert text_tree(host.target) == V2
    assert [r["status"] for r in server.reports] == [SUCCEEDED]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
@pytest.mark.parametrize("waiting", ["sleeping", "long poll"])
def test_a_signal_between_commands_stops_the_agent_promptly(host, server, agents, waiting,
                                                           signum):
    server.publish(make_bundle(1, V1))
    if waiting == "long poll":
        server.long_poll_s = 60
    agent = agents("--poll-interval", "60")
    wait_until(lambda: len(server.reports) == 1, what="the report of #1")
    if waiting == "long poll":
        wait_until(lambda: any("?wait=" in path for _, path, *_ in server.calls("desired")),
                   what="a held poll")
    else:
        agent.wait_for_log("reported #1 succeeded")
    time.sleep(0.2)

    sent = send(agent, signum)

    assert_stopped(agent, signum, sent, within=3.0)
    assert text_tree(host.target) == V1


@pytest.mark.slow
def test_a_sigterm_anywhere_in_an_apply_leaves_each_file_old_or_new_and_recoverable(
        host, server, agents):
    """SIGTERM at a spread of moments in an apply writing many files in place: each
    live file is whole, #1's or #2's, and the next start ends in sync at #2."""
    old = {f"conf.d/site-{i:03d}.conf": f"old {i}\n" * 20 for i in range(150)}
    new = {path: content.replace("old", "new") for path, content in old.items()}
    new["conf.d/added.conf"] = "only in #2\n"
    for round_, delay in enumerate((0.0, 0.02, 0.05, 0.1, 0.2, 0.4)):
        root = host.tmp_path / f"round-{round_}"
        (root / "target").mkdir(parents=True)
        this = Host(tmp_path=root, target=root / "target", state_dir=root / "state")
        this.applier().apply(make_bundle(1, old), this.load_state())
        server.publish(make_bundle(2, new))
        agent = agents("--validate-command", "true", "--reload-command", "true", on=this)
        agent.wait_for_log("applying #2")
        time.sleep(delay)

        sent = send(agent, signal.SIGTERM)

        code = agent.wait(timeout=20)
        assert code == EXIT_FOR[signal.SIGTERM], (delay, code, agent.log()[-2000:])
        assert time.monotonic() - sent < 5
        live = {p: c for p, c in text_tree(this.target).items() if ".bellwether-tmp-" not in p}
        assert set(live) <= set(old) | set(new)
        assert all(live[p] in (old.get(p), new.get(p)) for p in live), delay
        again = agents("--once", "--validate-command", "true", "--reload-command", "true",
                       on=this)
        assert again.wait() == EXIT_OK, again.log()[-2000:]
        assert text_tree(this.target) == new, delay
        assert temp_files(this.target, this.state_dir) == []
