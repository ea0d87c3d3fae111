"""`python -m agent` as a real process: help, configuration errors, enrollment, a
run against a local protocol server, and finishing an apply a crash interrupted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import OPTIONS
from agent.runner import EXIT_CONFIG, EXIT_OK, EXIT_UNAUTHORIZED, EXIT_UNREACHABLE
from tests.agent.support import (
    REPO_ROOT,
    agent_env,
    apply_in_a_process,
    closed_port,
    counting,
    make_bundle,
    runs,
    temp_files,
    text_tree,
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
                    "3 the server refused the token", "4 the server is unreachable"):
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
    assert json.loads(Path(host.state_file).read_text())["token"] == server.token
    assert server.calls("desired")[-1][3]["Authorization"] == f"Bearer {server.token}"


def test_a_refused_enrollment_token_exits_3(host, server):
    result = once(host, server.url, "--enrollment-token", "bwe_used_up")

    assert result.returncode == EXIT_UNAUTHORIZED
    assert "enrollment refused" in result.stderr


def test_enrollment_against_an_unreachable_server_exits_4(host):
    result = once(host, f"http://127.0.0.1:{closed_port()}", "--enrollment-token", "bwe_x")

    assert result.returncode == EXIT_UNREACHABLE


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

    result = once(host, server.url, "--token-file", str(token_file))

    assert result.returncode == 0, result.stderr
    assert server.requests
    assert all(r[3].get("Authorization") == f"Bearer {server.token}" for r in server.requests)


def test_bellwether_token_variable_authenticates(host, server):
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
