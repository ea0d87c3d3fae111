"""Validate before swap: a validate command naming {staged} checks the snapshot
staged inside the target's filesystem; only a validated snapshot is swapped in
(one rename per file). A command that checks files in place keeps the old order."""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from agent.apply import FAILED, SUCCEEDED, WARNING
from agent.state import State
from tests.agent.support import (
    REPO_ROOT,
    agent_env,
    counting,
    make_bundle,
    runs,
    script,
    sealed,
    text_tree,
)

V1 = {"nginx.conf": "worker_processes 2;\n", "old-only.conf": "only in #1\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/new-only.conf": "only in #2\n"}


def checker(tmp_path, *, exit_code: int = 0) -> tuple:
    """A validate command naming {staged}: it logs what it sees live and staged."""
    log = Path(tmp_path) / "seen.log"
    command = script(tmp_path, "check.sh",
                     f'{{ echo "arg=$1"; echo "env=$BELLWETHER_STAGED_DIR"; '
                     f'cat "$T/nginx.conf" 2>/dev/null || echo "live=none"; '
                     f'cat "$1/nginx.conf"; ls "$1/conf.d" 2>/dev/null; }} > "{log}"\n'
                     f"exit {exit_code}\n")
    return f"{command} {{staged}}", log


def test_the_staged_tree_is_validated_before_anything_is_live(host):
    validate, log = checker(host.tmp_path)
    reload, reloads = counting(host.tmp_path, "reload")
    state = State()
    host.applier().apply(make_bundle(1, V1), state)

    outcome = host.applier(validate=validate, reload=reload).apply(make_bundle(2, V2), state)

    assert outcome.status == SUCCEEDED, outcome.message
    seen = log.read_text().splitlines()
    staged = seen[0].split("=", 1)[1]
    assert seen[1] == f"env={staged}"
    assert os.path.dirname(staged) == str(host.target)  # same filesystem: renames
    # While it ran, the live file was still #1's; the staged one #2's.
    assert seen[2:] == ["worker_processes 2;", "worker_processes 4;", "new-only.conf"]
    assert text_tree(host.target) == V2
    assert runs(reloads) == ["2"]
    assert not os.path.exists(staged)


def test_a_staged_tree_failing_validation_changes_nothing_and_reloads_nothing(host):
    validate, _ = checker(host.tmp_path, exit_code=1)
    reload, reloads = counting(host.tmp_path, "reload")
    state = State()
    host.applier().apply(make_bundle(1, V1), state)
    before = {p: os.stat(host.target / p).st_ino for p in V1}

    outcome = host.applier(validate=validate, reload=reload).apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING
    assert "nothing was changed, #1 stays" in outcome.message
    assert text_tree(host.target) == V1
    assert {p: os.stat(host.target / p).st_ino for p in V1} == before  # not even rewritten
    assert runs(reloads) == []
    assert state.active_number == 1 and state.in_progress is None


def test_a_first_snapshot_failing_staged_validation_gets_the_fallback_checked_in_place(host):
    validate, log = checker(host.tmp_path, exit_code=0)
    failing = script(host.tmp_path, "fail-once.sh",
                     f'case "$1" in *staged) exit 1;; esac\n{validate.split(" {")[0]} "$1"\n')
    state = State()

    outcome = host.applier(validate=f"{failing} {{staged}}").apply(
        make_bundle(1, V1, fallback={"nginx.conf": "safe;\n"}), state)

    assert outcome.status == WARNING and "safe fallback" in outcome.message
    assert log.read_text().splitlines()[0] == f"arg={host.target}"
    assert text_tree(host.target) == {"nginx.conf": "safe;\n"}


def test_a_staged_secret_file_is_0600_once_live(host):
    validate, _ = checker(host.tmp_path)
    files = {"nginx.conf": "password " + sealed("env:BW_STAGED_SECRET") + ";\n"}

    outcome = host.applier(validate=validate, environ={"BW_STAGED_SECRET": "s3"}).apply(
        make_bundle(1, files), State())

    assert outcome.status == SUCCEEDED, outcome.message
    assert (host.target / "nginx.conf").read_text() == "password s3;\n"
    assert stat.S_IMODE(os.stat(host.target / "nginx.conf").st_mode) == 0o600


def test_an_agent_killed_during_a_slow_validate_leaves_no_unvalidated_file_live(
        host, server):
    server.publish(make_bundle(1, V1))
    base = [sys.executable, "-m", "agent", "--once", "--server", server.url,
            "--target-dir", str(host.target), "--state-dir", str(host.state_dir),
            "--token", server.token]
    assert subprocess.run(base, cwd=REPO_ROOT, env=agent_env(), capture_output=True,
                          timeout=60).returncode == 0
    server.publish(make_bundle(2, V2))
    started = host.tmp_path / "validate.pid"
    slow = script(host.tmp_path, "slow.sh", f'echo $$ > "{started}"\nsleep 60\n')
    agent = subprocess.Popen([*base, "--validate-command", f"{slow} {{staged}}"],
                             cwd=REPO_ROOT, env=agent_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (started.exists() and started.read_text().strip()):
            assert time.monotonic() < deadline and agent.poll() is None
            time.sleep(0.05)
        live_during = {p: c for p, c in text_tree(host.target).items()
                       if ".bellwether-tmp-" not in p}
        agent.send_signal(signal.SIGKILL)
        agent.wait(timeout=10)
    finally:
        if agent.poll() is None:
            agent.kill()
        if started.exists():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.killpg(int(started.read_text()), signal.SIGKILL)  # its own group

    assert live_during == V1
    leftover = {p: c for p, c in text_tree(host.target).items()
                if ".bellwether-tmp-" not in p}
    assert leftover == live_during  # killed: still #1, nothing unvalidated in place

    restart = subprocess.run([*base, "--validate-command", 'test -f {staged}/nginx.conf'],
                             cwd=REPO_ROOT, env=agent_env(), capture_output=True, text=True,
                             timeout=60)

    assert restart.returncode == 0, restart.stderr
    assert "an unvalidated staged snapshot" in restart.stderr
    assert text_tree(host.target) == V2
    assert [r["status"] for r in server.reports] == [SUCCEEDED, SUCCEEDED]


def test_a_validate_command_without_staged_still_checks_files_in_place(host):
    seen = host.tmp_path / "in-place.log"
    validate = script(host.tmp_path, "in-place.sh", f'cat "$T/nginx.conf" > "{seen}"\n'
                                                    '[ -z "$BELLWETHER_STAGED_DIR" ]\n')

    outcome = host.applier(validate=validate).apply(make_bundle(1, V1), State())

    assert outcome.status == SUCCEEDED, outcome.message
    assert seen.read_text() == V1["nginx.conf"]  # the new file was live when it ran


def test_staging_into_a_target_that_cannot_take_it_is_a_warning_with_nothing_changed(
        host, monkeypatch):
    validate, _ = checker(host.tmp_path)
    state = State()
    host.applier().apply(make_bundle(1, V1), state)
    real = os.mkdir

    def no_room(path, *args, **kwargs):
        if ".bellwether-tmp-" in str(path):
            raise OSError(28, "No space left on device", str(path))
        return real(path, *args, **kwargs)
    monkeypatch.setattr(os, "mkdir", no_room)

    outcome = host.applier(validate=validate).apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING and "staging failed" in outcome.message
    assert text_tree(host.target) == V1
    assert outcome.status != FAILED
