"""`python -m agent` as a real process: help, configuration errors, enrollment, a
run against a local protocol server, and finishing an apply a crash interrupted."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import OPTIONS
from agent.runner import (
    EXIT_BLOCKED,
    EXIT_CONFIG,
    EXIT_NOTHING_DESIRED,
    EXIT_OK,
    EXIT_UNAUTHORIZED,
    EXIT_UNREACHABLE,
)
from tests.agent.support import (
    REPO_ROOT,
    AgentProcess,
    ProtocolServer,
    agent_env,
    apply_in_a_process,
    closed_port,
    counting,
    make_bundle,
    runs,
    temp_files,
    text_tree,
    wait_until,
)

V1 = {"nginx.conf": "worker_processes 2;\n", "old-only.conf": "only in #1\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/new-only.conf": "only in #2\n"}


def python_m_agent(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agent", *args], cwd=REPO_ROOT,
                          env=agent_env(**env), capture_output=True, text=True, timeout=60)


def once(host, server_url, *extra) -> subprocess.CompletedProcess:
    return python_m_agent("--once", "--server", server_url, "--target-dir", str(host.target),
                          "--state-dir", str(host.state_dir), *extra)


def test_help_exits_0_and_explains_every_option_and_the_exit_codes():
    result = python_m_agent("--help")

    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    for name, _ in OPTIONS:
        assert f"--{name.replace('_', '-')}" in text
    for flag in ("--config", "--once"):
        assert flag in text
    for meaning in ("0 in sync or applied", "1 the snapshot failed", "2 bad configuration",
                    "3 the server refused the token", "4 the server is unreachable",
                    "6 the desired snapshot is blocked", "7 no snapshot is desired yet",
                    "130, 143 stopped by SIGINT, SIGTERM"):
        assert meaning in text
    assert "BELLWETHER_" in text


def test_no_arguments_exits_2_with_a_clear_message():
    result = python_m_agent()

    assert result.returncode == EXIT_CONFIG
    assert result.stderr.strip() == "python -m agent: --server is required"


def test_an_unknown_flag_exits_2():
    result = python_m_agent("--no-such-flag")

    assert result.returncode == 2
    assert "unrecognized arguments: --no-such-flag" in result.stderr


def test_neither_token_nor_enrollment_token_exits_2(host, server):
    result = once(host, server.url)

    assert result.returncode == EXIT_CONFIG
    assert "no --token, --token-file or BELLWETHER_TOKEN, and no --enrollment-token" \
        in result.stderr
    assert server.requests == []


def test_an_unknown_log_level_exits_2_with_a_clear_message(host, server):
    result = once(host, server.url, "--token", server.token, "--log-level", "LOUD")

    assert result.returncode == EXIT_CONFIG
    assert "Traceback" not in result.stderr


def test_enrolls_once_applies_and_reports(host, server):
    bundle = server.publish(make_bundle(1, V1))

    first = once(host, server.url, "--enrollment-token", server.ENROLLMENT_TOKEN,
                 "--name", "web-1", "--labels", "role=web,zone=eu")
    second = once(host, server.url, "--enrollment-token", server.ENROLLMENT_TOKEN)

    assert (first.returncode, second.returncode) == (EXIT_OK, EXIT_OK), first.stderr
    assert server.enrolled == [{"enrollment_token": server.ENROLLMENT_TOKEN, "name": "web-1",
                                "labels": {"role": "web", "zone": "eu"}}]
    assert text_tree(host.target) == V1
    assert [r["status"] for r in server.reports] == ["succeeded"]
    assert server.reports[0]["checksum"] == bundle["checksum"]
    identity = json.loads((host.state_dir / "identity.json").read_text())
    assert identity == {"token": server.token, "name": "web-1"}
    assert "token" not in json.loads(Path(host.state_file).read_text())
    assert server.calls("desired")[-1][3]["Authorization"] == f"Bearer {server.token}"
    # The second run had no --name: its log lines name the agent as it enrolled.
    assert " INFO web-1 agent " in second.stderr and second.stdout == "web-1: in sync at #1\n"


def test_a_refused_enrollment_token_exits_3(host, server):
    result = once(host, server.url, "--enrollment-token", "bwe_used_up")

    assert result.returncode == EXIT_UNAUTHORIZED
    assert "enrollment refused" in result.stderr


def test_enrollment_against_an_unreachable_server_exits_4(host):
    result = once(host, f"http://127.0.0.1:{closed_port()}", "--enrollment-token", "bwe_x")

    assert result.returncode == EXIT_UNREACHABLE


def test_first_start_against_a_dead_url_keeps_retrying_then_enrolls(host, tmp_path):
    """Without --once a server that does not answer yet is asked again with backoff,
    each failure logged, until it answers: a service must not exit 4 at boot."""
    port = closed_port()
    agent = AgentProcess(["--server", f"http://127.0.0.1:{port}", "--target-dir",
                          str(host.target), "--state-dir", str(host.state_dir),
                          "--enrollment-token", ProtocolServer.ENROLLMENT_TOKEN,
                          "--name", "web-1"], tmp_path)
    server = ProtocolServer()
    try:
        wait_until(lambda: agent.log().count("enrollment failed") >= 2
                   or agent.process.poll() is not None, what="two failed enrollments")
        assert agent.process.poll() is None, agent.log()
        assert "retrying in" in agent.log()
        server.port = port
        server.start()
        server.publish(make_bundle(1, V1))
        wait_until(lambda: text_tree(host.target) == V1 or agent.process.poll() is not None,
                   what="the snapshot applied")
        assert agent.process.poll() is None, agent.log()
        assert server.enrolled and "enrolled as web-1" in agent.log()
    finally:
        agent.process.terminate()
        agent.wait()
        server.stop()


MISPLACED_TOKENS = {
    "api token as enrollment token": (
        ["--enrollment-token", "bwu_0123456789ab.secret"], {},
        "--enrollment-token is an API token (bwu_…), not an enrollment token"),
    "agent token as enrollment token": (
        ["--enrollment-token", "bwa_0123456789ab.secret"], {},
        "--enrollment-token is an agent token (bwa_…), not an enrollment token"),
    "enrollment token as --token": (
        ["--token", "bwe_0123456789ab.secret"], {},
        "--token (or BELLWETHER_TOKEN) holds an enrollment token (bwe_…), not an agent token"),
    "enrollment token in BELLWETHER_TOKEN": (
        [], {"BELLWETHER_TOKEN": "bwe_0123456789ab.secret"},
        "--token (or BELLWETHER_TOKEN) holds an enrollment token (bwe_…)"),
    "api token in a token file": (
        ["--token-file", "TOKEN_FILE"], {},
        "--token-file holds an API token (bwu_…), not an agent token"),
}


@pytest.mark.parametrize("case", MISPLACED_TOKENS)
def test_a_token_of_the_wrong_kind_exits_2_saying_what_it_is_before_sending(
        case, host, server, tmp_path):
    args, env, expected = MISPLACED_TOKENS[case]
    token_file = tmp_path / "token"
    token_file.write_text("bwu_0123456789ab.secret\n")
    args = [str(token_file) if a == "TOKEN_FILE" else a for a in args]

    result = python_m_agent("--once", "--server", server.url, "--target-dir",
                            str(host.target), "--state-dir", str(host.state_dir), *args, **env)

    assert result.returncode == EXIT_CONFIG, result.stderr
    assert expected in result.stderr
    if "bwu_" in expected and "enrollment-token" in expected:
        assert "manage.py enrollment_token create <app>/<env>" in result.stderr
    assert "Traceback" not in result.stderr
    assert server.requests == []


def test_a_revoked_token_exits_3(host, server):
    result = once(host, server.url, "--token", "bwa_revoked")

    assert result.returncode == EXIT_UNAUTHORIZED


def test_an_unreachable_server_exits_4_and_leaves_the_files_alone(host):
    (host.target / "nginx.conf").write_text("current\n")

    result = once(host, f"http://127.0.0.1:{closed_port()}", "--token", "bwa_x")

    assert result.returncode == EXIT_UNREACHABLE
    assert text_tree(host.target) == {"nginx.conf": "current\n"}


def test_a_failing_validate_command_exits_1(host, server):
    server.publish(make_bundle(1, V1))

    result = once(host, server.url, "--token", server.token, "--validate-command", "false")

    assert result.returncode == 1
    assert server.reports[0]["status"] == "failed"


def test_the_restart_after_a_crash_restores_then_finishes_the_apply(host, server):
    host.applier().apply(make_bundle(1, V1), host.load_state())
    bundle = server.publish(make_bundle(2, V2))
    crashed = apply_in_a_process(host.tmp_path, host.target, host.state_dir, bundle,
                                 validate="kill -9 $PPID; sleep 2")
    assert crashed.returncode < 0 and host.load_state().in_progress is not None
    reload, reload_log = counting(host.tmp_path, "reload")

    result = once(host, server.url, "--token", server.token, "--validate-command", "true",
                  "--reload-command", reload)

    assert result.returncode == EXIT_OK, result.stderr
    assert "an apply of #2 was interrupted; restored the previous files" in result.stderr
    assert runs(reload_log) == ["1", "2"]  # the restored #1, then #2 applied to the end
    assert text_tree(host.target) == V2
    assert temp_files(host.target, host.state_dir) == []
    saved = host.load_state()
    assert (saved.active_number, saved.in_progress) == (2, None)
    assert [r["status"] for r in server.reports] == ["succeeded"]


def test_configuration_from_variables_and_a_file(host, server, tmp_path):
    server.publish(make_bundle(1, V1))
    ini = tmp_path / "agent.ini"
    ini.write_text(f"[agent]\nserver = {server.url}\ntarget_dir = {host.target}\n"
                   f"state_dir = {host.state_dir}\n")

    result = python_m_agent("--once", BELLWETHER_CONFIG=str(ini),
                            BELLWETHER_TOKEN=server.token)

    assert result.returncode == EXIT_OK, result.stderr
    assert text_tree(host.target) == V1


# --- the token off the command line ---------------------------------------------------------


def test_token_file_authenticates_without_the_token_on_argv(host, server, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(server.token + "\n")
    token_file.chmod(0o600)
    server.publish(make_bundle(1, V1))

    result = once(host, server.url, "--token-file", str(token_file))

    assert result.returncode == 0, result.stderr
    assert server.requests
    assert all(r[3].get("Authorization") == f"Bearer {server.token}" for r in server.requests)


def test_bellwether_token_variable_authenticates(host, server):
    server.publish(make_bundle(1, V1))
    result = python_m_agent("--once", "--server", server.url, "--target-dir", str(host.target),
                            "--state-dir", str(host.state_dir), BELLWETHER_TOKEN=server.token)

    assert result.returncode == 0, result.stderr
    assert server.requests


@pytest.mark.parametrize("content", [None, "", "\n"])
def test_an_unreadable_or_empty_token_file_exits_2_naming_it(host, server, tmp_path, content):
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)

    result = once(host, server.url, "--token-file", str(token_file))

    assert result.returncode == EXIT_CONFIG
    assert str(token_file) in result.stderr and "Traceback" not in result.stderr
    assert server.requests == []


def test_state_dir_inside_the_target_dir_exits_2(host, server):
    result = python_m_agent("--once", "--server", server.url, "--target-dir", str(host.target),
                            "--state-dir", str(host.target / "state"), "--token", server.token)

    assert result.returncode == EXIT_CONFIG
    assert "must not be inside one another" in result.stderr


# --- configuration mistakes: exit 2, the option named, no traceback ------------------


def _no_traceback(result, *needles):
    assert result.returncode == EXIT_CONFIG, result.stderr
    assert "Traceback" not in result.stderr
    for needle in needles:
        assert needle in result.stderr


def test_a_target_dir_that_is_a_file_exits_2_before_enrolling(host, server, tmp_path):
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")

    result = python_m_agent("--once", "--server", server.url, "--target-dir", str(a_file),
                            "--state-dir", str(host.state_dir),
                            "--enrollment-token", server.ENROLLMENT_TOKEN)

    _no_traceback(result, "--target-dir", str(a_file), "is not a directory")
    assert server.requests == []  # the enrollment token was not spent


def test_an_unwritable_state_dir_exits_2_naming_it(host, server, tmp_path):
    blocker = tmp_path / "blocker"
    blocker.write_text("x")  # a directory cannot be made under a file

    result = once(host, server.url, "--token", server.token, "--state-dir",
                  str(blocker / "state"))

    _no_traceback(result, "--state-dir", str(blocker / "state"))
    assert server.requests == []


def test_a_read_only_state_dir_exits_2_naming_it(host, server, read_only_mount):
    state = read_only_mount(host.tmp_path / "ro-state")

    result = once(host, server.url, "--token", server.token, "--state-dir", str(state))

    _no_traceback(result, "--state-dir", str(state), "not writable")


def test_an_ini_file_without_an_agent_section_exits_2(host, server, tmp_path):
    ini = tmp_path / "agent.ini"
    ini.write_text("[agnet]\nserver = http://x\n")

    result = once(host, server.url, "--config", str(ini))

    _no_traceback(result, "--config", str(ini), "no [agent] section", "agnet")


@pytest.mark.parametrize("url", ["bellwether.example.com", "127.0.0.1:8000", "ftp://x",
                                 "https://", "http://ok.example,nohost"])
def test_a_server_url_without_a_scheme_or_host_exits_2(host, url):
    result = python_m_agent("--once", "--server", url, "--target-dir", str(host.target),
                            "--state-dir", str(host.state_dir), "--token", "bwa_x.y")

    _no_traceback(result, "--server", "is not a URL")


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-5", "0.5"])
def test_a_bad_poll_interval_exits_2_naming_the_option(host, server, value):
    result = once(host, server.url, "--token", server.token, "--poll-interval", value)

    _no_traceback(result, "--poll-interval")
    assert "could not convert" not in result.stderr


# --- --once says what it did ----------------------------------------------------------


def test_once_says_applied_then_in_sync_then_failed(host, server):
    server.publish(make_bundle(1, V1))
    applied = once(host, server.url, "--token", server.token, "--name", "web-9")
    again = once(host, server.url, "--token", server.token, "--name", "web-9")
    server.publish(make_bundle(2, V2))
    failed = once(host, server.url, "--token", server.token, "--name", "web-9",
                  "--validate-command", "false")

    assert applied.stdout == "web-9: applied #1 (2 file(s))\n"
    assert again.stdout == "web-9: in sync at #1\n"
    assert failed.returncode == 1
    assert failed.stdout.startswith("web-9: warning: #2 failed (validate exited 1)")
    assert " web-9 agent " in failed.stderr  # every log line names the agent


def test_once_exits_6_for_a_blocked_snapshot_and_says_a_push_retries_it(host, server):
    server.publish(make_bundle(1, V1))
    assert once(host, server.url, "--token", server.token).returncode == EXIT_OK
    server.publish(make_bundle(2, V2))
    failed = once(host, server.url, "--token", server.token, "--validate-command", "false")
    unchanged = once(host, server.url, "--token", server.token)  # a 304
    server.desired = dict(server.desired, poll_interval_s=11)  # a 200, still #2
    answered = once(host, server.url, "--token", server.token)

    assert failed.returncode == 1, failed.stderr
    for result in (unchanged, answered):
        assert result.returncode == EXIT_BLOCKED, result.stderr
        assert "#2 is blocked after it failed here" in result.stdout
        assert ("an operator pushes #2 again (POST /api/v1/environments/<app>/<env>/"
                "snapshots/2/deploy) to retry it") in result.stdout
    assert text_tree(host.target) == V1


def test_once_exits_7_when_no_snapshot_is_desired_yet(host, server):
    answered = once(host, server.url, "--token", server.token, "--name", "web-9")
    unchanged = once(host, server.url, "--token", server.token, "--name", "web-9")  # a 304

    for result in (answered, unchanged):
        assert result.returncode == EXIT_NOTHING_DESIRED, result.stderr
        assert result.stdout == "web-9: nothing to apply: no snapshot desired yet\n"


def test_once_says_when_the_server_is_unreachable(host):
    result = once(host, f"http://127.0.0.1:{closed_port()}", "--token", "bwa_x.y",
                  "--name", "web-9")

    assert result.returncode == EXIT_UNREACHABLE
    assert result.stdout.startswith("web-9: failed: server unavailable:")


# --- failover -------------------------------------------------------------------------


def test_fails_over_to_the_next_server_and_goes_back_to_the_first(host, server):
    second = ProtocolServer().start()
    try:
        for running in (server, second):
            running.publish(make_bundle(1, V1))
        server.fail("desired", 503)

        failed_over = once(host, f"{server.url},{second.url}", "--token", server.token)
        server.publish(make_bundle(2, V2))
        second.publish(make_bundle(2, V2))
        back = once(host, server.url, "--server", second.url, "--token", server.token)
    finally:
        second.stop()

    assert failed_over.returncode == EXIT_OK, failed_over.stderr
    assert [r["snapshot"] for r in second.reports] == [1]
    assert "trying the next server" in failed_over.stderr
    assert back.returncode == EXIT_OK, back.stderr
    assert [r["snapshot"] for r in server.reports] == [2]  # the first answers again
    assert text_tree(host.target) == V2


def test_fails_over_from_a_dead_port_and_reports_there(host, server):
    server.publish(make_bundle(1, V1))

    result = once(host, f"http://127.0.0.1:{closed_port()}", "--server", server.url,
                  "--token", server.token)

    assert result.returncode == EXIT_OK, result.stderr
    assert [r["status"] for r in server.reports] == ["succeeded"]


def test_every_server_down_is_unreachable(host):
    result = once(host, f"http://127.0.0.1:{closed_port()},http://127.0.0.1:{closed_port()}",
                  "--token", "bwa_x.y")

    assert result.returncode == EXIT_UNREACHABLE


# --- the oldest Python the agent claims (docs/agents.md) ------------------------------


def oldest_python():
    # A pyenv installation first: its shim on PATH may not be able to run it.
    installed = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    found = installed[0] if installed else shutil.which("python3.8")
    if found is None:
        pytest.skip("no python3.8 on this machine")
    return found


def test_the_agent_runs_on_python_3_8(host, server):
    python = oldest_python()
    server.publish(make_bundle(1, V1))

    result = subprocess.run(
        [python, "-m", "agent", "--once", "--server", f"http://127.0.0.1:{closed_port()}",
         "--server", server.url, "--target-dir", str(host.target), "--state-dir",
         str(host.state_dir), "--enrollment-token", server.ENROLLMENT_TOKEN, "--name", "old",
         "--validate-command", "test -f {staged}/nginx.conf"],
        cwd=REPO_ROOT, env=agent_env(), capture_output=True, text=True, timeout=60)

    assert result.returncode == EXIT_OK, result.stderr
    assert result.stdout == "old: applied #1 (2 file(s))\n"
    assert text_tree(host.target) == V1
