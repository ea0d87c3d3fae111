"""Host faults with the real agent process: a read-only target directory, a full
state directory, a truncated state or identity file. Each ends in a report and a
blocked version (or a clean start), never in an "unexpected error" loop.

The filesystems are real: small tmpfs mounts, remounted read-only (the tests run
as root, where file modes do not stop writes). Where mounting is not permitted
they are skipped; the unit tests at the end make the OS call fail instead."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.apply import FAILED, SUCCEEDED, WARNING
from agent.runner import EXIT_APPLY_FAILED, EXIT_BLOCKED, EXIT_OK
from agent.state import Identity, State
from tests.agent.support import REPO_ROOT, agent_env, make_bundle, script, text_tree

V1 = {"nginx.conf": "worker_processes 2;\n", "old-only.conf": "only in #1\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/new-only.conf": "only in #2\n"}


def once(host, server, *extra) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agent", "--once", "--server", server.url, "--target-dir",
         str(host.target), "--state-dir", str(host.state_dir), "--name", "web-1", *extra],
        cwd=REPO_ROOT, env=agent_env(), capture_output=True, text=True, timeout=60)


def live(target) -> dict:
    """The files in place, without the agent's own temp or staging entries."""
    return {p: c for p, c in text_tree(target).items() if ".bellwether-tmp-" not in p}


def fill(directory: Path) -> None:
    """Fill the filesystem of `directory` to the last byte."""
    with open(directory / "filler", "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


# --- a read-only target directory ---------------------------------------------------------


@pytest.mark.parametrize("validate", ["true", "test -f {staged}/nginx.conf"])
def test_a_read_only_target_is_reported_and_the_version_blocked(host, server, mounts,
                                                                validate):
    mounts.tmpfs(host.target)
    server.publish(make_bundle(1, V1))
    assert once(host, server, "--token", server.token).returncode == EXIT_OK
    mounts.read_only(host.target)
    server.publish(make_bundle(2, V2))

    result = once(host, server, "--token", server.token, "--validate-command", validate)
    again = once(host, server, "--token", server.token, "--validate-command", validate)

    assert result.returncode == EXIT_APPLY_FAILED, result.stderr
    report = server.reports[-1]
    assert (report["snapshot"], report["status"]) == (2, WARNING)
    assert "Read-only file system" in report["message"] and "#1" in report["message"]
    assert result.stdout.startswith("web-1: warning: #2 failed")
    assert "unexpected error" not in result.stderr and "Traceback" not in result.stderr
    assert text_tree(host.target) == V1
    assert again.returncode == EXIT_BLOCKED, again.stderr
    assert again.stdout.startswith("web-1: #2 is blocked after it failed here")
    assert len(server.reports) == 2  # #1 succeeded, #2 warning: not retried


def test_a_target_turning_read_only_before_the_restore_is_failed_then_restored(
        host, server, mounts):
    mounts.tmpfs(host.target)
    server.publish(make_bundle(1, V1))
    assert once(host, server, "--token", server.token).returncode == EXIT_OK
    server.publish(make_bundle(2, V2))
    # Checks files in place: written, then the filesystem goes read-only, then it fails.
    remount = script(host.tmp_path, "remount.sh", 'mount -o remount,ro "$T"\nexit 1\n')

    result = once(host, server, "--token", server.token, "--validate-command", remount)

    assert result.returncode == EXIT_APPLY_FAILED, result.stderr
    report = server.reports[-1]
    assert (report["snapshot"], report["status"]) == (2, FAILED)
    assert "restoring the previous files failed too" in report["message"]
    assert "Read-only file system" in report["message"]
    assert "Traceback" not in result.stderr
    assert host.load_state().in_progress["number"] == 2  # the restore is still owed

    mounts.read_write(host.target)
    restart = once(host, server, "--token", server.token)

    assert restart.returncode == EXIT_BLOCKED, restart.stderr  # #2 failed: not retried
    assert "interrupted; restored the previous files" in restart.stderr
    assert live(host.target) == V1
    assert host.load_state().in_progress is None


# --- a full state directory ---------------------------------------------------------------


def test_a_full_state_dir_fails_the_apply_with_a_report_and_nothing_written(
        host, server, mounts):
    mounts.tmpfs(host.state_dir, size="64k")
    server.publish(make_bundle(1, V1))
    assert once(host, server, "--token", server.token).returncode == EXIT_OK
    fill(host.state_dir)
    server.publish(make_bundle(2, V2))

    result = once(host, server, "--token", server.token)

    assert result.returncode == EXIT_APPLY_FAILED, result.stderr
    report = server.reports[-1]
    assert (report["snapshot"], report["status"]) == (2, FAILED)
    assert "No space left on device" in report["message"]
    assert "nothing was written" in report["message"]
    assert "unexpected error" not in result.stderr and "Traceback" not in result.stderr
    assert live(host.target) == V1

    (host.state_dir / "filler").unlink()
    server.publish(make_bundle(3, V2))
    assert once(host, server, "--token", server.token).returncode == EXIT_OK
    assert live(host.target) == V2


# --- a truncated state file, a corrupt identity ---------------------------------------------


def test_a_truncated_state_file_is_moved_aside_and_the_agent_goes_on(host, server):
    server.publish(make_bundle(1, V1))
    first = once(host, server, "--enrollment-token", server.ENROLLMENT_TOKEN)
    assert first.returncode == EXIT_OK, first.stderr
    state_file = host.state_dir / "state.json"
    state_file.write_bytes(state_file.read_bytes()[:40])
    server.publish(make_bundle(2, V2))

    result = once(host, server, "--enrollment-token", server.ENROLLMENT_TOKEN)

    assert result.returncode == EXIT_OK, result.stderr
    assert "state.json is corrupt" in result.stderr and "moved it to" in result.stderr
    assert "Traceback" not in result.stderr
    assert len(server.enrolled) == 1  # the identity is apart: no second enrollment
    assert [p.name.startswith("state.json.corrupt-") for p in host.state_dir.iterdir()
            ].count(True) == 1
    # The previous copy told it which files were its own: old-only.conf is gone.
    assert live(host.target) == V2
    assert server.reports[-1]["status"] == SUCCEEDED


def test_a_corrupt_identity_falls_back_to_its_previous_copy(host, server):
    server.publish(make_bundle(1, V1))
    assert once(host, server, "--enrollment-token", server.ENROLLMENT_TOKEN).returncode == 0
    (host.state_dir / "identity.json").write_text('{"token": "bwa_')

    result = once(host, server, "--enrollment-token", server.ENROLLMENT_TOKEN)

    assert result.returncode == EXIT_OK, result.stderr
    assert "identity.json is corrupt" in result.stderr
    assert len(server.enrolled) == 1
    assert server.calls("desired")[-1][3]["Authorization"] == f"Bearer {server.token}"


def test_a_state_file_from_before_the_split_is_migrated(host, server):
    host.state_dir.mkdir()
    (host.state_dir / "state.json").write_text(json.dumps(
        {"active_number": 1, "active_checksum": make_bundle(1, V1)["checksum"],
         "managed_files": sorted(V1), "token": server.token}))
    for path, content in V1.items():
        (host.target / path).write_text(content)
    server.publish(make_bundle(1, V1))

    result = once(host, server)

    assert (result.returncode, result.stdout) == (EXIT_OK, "web-1: in sync at #1\n")
    assert json.loads((host.state_dir / "identity.json").read_text())["token"] == server.token
    assert "token" not in json.loads((host.state_dir / "state.json").read_text())


# --- the same faults at the OS-call level (no mount needed) ----------------------------------


def _fail(monkeypatch, module, name, err, *, when=lambda *a: True):
    real = getattr(module, name)

    def failing(*args, **kwargs):
        if when(*args):
            raise OSError(err, os.strerror(err), str(args[0]))
        return real(*args, **kwargs)
    monkeypatch.setattr(module, name, failing)


@pytest.mark.parametrize("err", [errno.EROFS, errno.EACCES, errno.EIO])
def test_an_os_error_on_every_write_is_a_warning_with_the_old_files_kept(host, monkeypatch,
                                                                          err):
    applier = host.applier()
    state = State()
    applier.apply(make_bundle(1, V1), state)
    target = str(host.target)
    _fail(monkeypatch, os, "open", err,
          when=lambda path, flags=0, *a: str(path).startswith(target) and flags & os.O_CREAT)
    _fail(monkeypatch, os, "unlink", err,
          when=lambda path, *a: str(path).startswith(target) and os.path.exists(path))

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING and os.strerror(err) in outcome.message
    assert live(host.target) == V1 and state.in_progress is None
    assert state.active_number == 1


def test_enospc_saving_the_state_is_logged_and_the_outcome_kept(host, caplog):
    def full(state):
        raise OSError(errno.ENOSPC, "No space left on device")
    applier = host.applier()
    applier.save = full
    state = State()

    outcome = applier.apply(make_bundle(1, V1), state,
                            record=lambda s, o: setattr(s, "unsent_report", {"s": o.status}))

    assert outcome.status == FAILED and "recording the apply" in outcome.message
    assert state.unsent_report == {"s": FAILED} and live(host.target) == {}
    assert "cannot save the state" in caplog.text


def test_a_report_that_cannot_be_sent_nor_saved_is_retried_with_jittered_backoff(
        host, server):
    server.publish(make_bundle(1, V1))
    server.fail("reports", 503, "drop", 502)
    delays, draws = [], iter([0.0, 1.0, 0.3, 0.7, 0.5, 0.5])

    class Stop(Exception):
        pass

    def sleep(seconds):
        delays.append(seconds)
        if server.accepted:
            raise Stop

    agent = host.agent(server.url, sleep=sleep, rng=lambda: next(draws))
    agent.save = agent.applier.save = lambda state: (_ for _ in ()).throw(
        OSError(errno.ENOSPC, "No space left on device"))

    with pytest.raises(Stop):
        agent.run()

    assert [r["status"] for r in server.accepted] == [FAILED]  # could not record the apply
    assert len(server.reports) == 4  # three refused or dropped, then accepted
    assert delays[:3] == pytest.approx([2.0 * 0.5, 4.0 * 1.0, 8.0 * 0.65])  # jittered


def test_identity_keeps_two_copies_from_the_first_save(tmp_path):
    Identity(token="bwa_a.b", name="web-1").save(str(tmp_path))

    (tmp_path / "identity.json").write_bytes(b"\xff\xfe")

    assert Identity.load(str(tmp_path)) == Identity(token="bwa_a.b", name="web-1")


@pytest.mark.parametrize("text", [
    "", "{", "[1, 2]", '{"managed_files": "x"}', "\xff", '{"managed_files": [1]}',
    '{"in_progress": {"number": 2}}', '{"in_progress": {"number": 2, "manifest": '
    '{"existed": "a", "paths": []}}}', '{"blocked": 3}', '{"active_number": "7"}',
    '{"processed_deployments": []}', "null", '"text"'])
def test_a_corrupt_state_loads_as_a_fresh_one_keeping_the_previous_managed_files(
        tmp_path, text, caplog):
    path = str(tmp_path / "state.json")
    State(active_number=1, managed_files=["a.conf"]).save(path)
    State(active_number=2, managed_files=["a.conf", "b.conf"]).save(path)
    Path(path).write_text(text, encoding="latin-1")

    state = State.load(path)

    assert state == State(managed_files=["a.conf"])
    assert not os.path.exists(path) and "is corrupt" in caplog.text


def test_a_target_dir_with_spaces_and_quotes_is_quoted_for_staged_commands(tmp_path):
    from tests.agent.conftest import Host
    target = tmp_path / "it's a target"
    target.mkdir()
    host = Host(tmp_path=tmp_path, target=target, state_dir=tmp_path / "state")

    outcome = host.applier(validate="test -f {staged}/nginx.conf").apply(
        make_bundle(1, V1), State())

    assert outcome.status == SUCCEEDED, outcome.message
    assert text_tree(target) == V1
