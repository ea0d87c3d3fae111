"""agent/apply.py with fault injection through real commands: validate fails, reload
fails, start, the safe fallback, timeouts, and what the commands see."""

from __future__ import annotations

import os
import shlex
import time

import pytest

from agent.apply import FAILED, SUCCEEDED, WARNING
from tests.agent.support import counting, make_bundle, runs, script, temp_files, text_tree, tree

V1 = {"nginx.conf": "worker_processes 2;\n", "conf.d/shop.conf": "listen 80;\n",
      "old-only.conf": "only in #1\n"}
V2 = {"nginx.conf": "worker_processes 4; BROKEN\n", "conf.d/shop.conf": "listen 8080;\n",
      "conf.d/new-only.conf": "only in #2\n"}
FALLBACK = {"nginx.conf": "return 503 'No valid configuration';\n", "fallback.html": "503\n"}


def rejects_broken(tmp_path, name="validate"):
    """A validate command like `nginx -t`: fails when nginx.conf says BROKEN."""
    return script(tmp_path, f"{name}.sh",
                  "if grep -q BROKEN $T/nginx.conf; then\n"
                  "  echo 'nginx: [emerg] unknown directive BROKEN' >&2; exit 1\n"
                  "fi\n")


@pytest.fixture
def on_v1(host):
    """Snapshot #1 active, applied with no commands; its files and state captured."""
    outcome = host.applier().apply(make_bundle(1, V1), host.load_state())
    assert outcome.status == SUCCEEDED
    return tree(host.target), host.load_state()


# --- validate ------------------------------------------------------------------------


def test_validate_failure_restores_old_files_byte_for_byte_reloads_and_warns(host, on_v1):
    files_before, state_before = on_v1
    reload, reload_log = counting(host.tmp_path, "reload")
    applier = host.applier(validate=rejects_broken(host.tmp_path), reload=reload)
    state = host.load_state()

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING
    assert outcome.message.startswith("#2 failed (validate exited 1: nginx: [emerg] unknown "
                                      "directive BROKEN); restored #1")
    assert tree(host.target) == files_before  # new-only file gone, old-only file back
    assert runs(reload_log) == ["1"]  # the restored #1 was reloaded, #2 never
    assert host.load_state() == state_before
    assert temp_files(host.target, host.state_dir) == []


def test_validate_runs_against_the_new_files_in_place(host, on_v1):
    seen = host.tmp_path / "seen-by-validate"
    validate = script(host.tmp_path, "copy.sh", f"cat $T/nginx.conf > {shlex.quote(str(seen))}\n"
                                                "exit 1\n")

    host.applier(validate=validate).apply(make_bundle(2, V2), host.load_state())

    assert seen.read_text() == V2["nginx.conf"]
    assert (host.target / "nginx.conf").read_text() == V1["nginx.conf"]


def test_validate_failing_with_the_command_false_restores_and_warns(host, on_v1):
    files_before, _ = on_v1

    outcome = host.applier(validate="false").apply(make_bundle(2, V2), host.load_state())

    assert outcome.status == WARNING
    assert "validate exited 1" in outcome.message
    assert tree(host.target) == files_before


# --- reload and start -------------------------------------------------------------------


def test_reload_failure_restores_old_files_reloads_them_and_warns(host, on_v1):
    files_before, state_before = on_v1
    reload_log = host.tmp_path / "reload.log"
    # Like a service refusing the new config at reload time, but taking the old one.
    reload = script(host.tmp_path, "reload.sh",
                    f'echo "$BELLWETHER_SNAPSHOT" >> {shlex.quote(str(reload_log))}\n'
                    "grep -q 8080 $T/conf.d/shop.conf && { echo 'bind failed' >&2; exit 3; }\n"
                    "exit 0\n")
    applier = host.applier(validate="true", reload=reload)

    outcome = applier.apply(make_bundle(2, {**V2, "nginx.conf": "fine\n"}), host.load_state())

    assert outcome.status == WARNING
    assert "reload exited 3: bind failed" in outcome.message
    assert "restored #1" in outcome.message
    assert tree(host.target) == files_before
    assert runs(reload_log) == ["2", "1"]
    assert host.load_state() == state_before


def test_reload_failing_again_after_the_restore_is_failed(host, on_v1):
    files_before, _ = on_v1
    applier = host.applier(validate="true", reload="false")

    outcome = applier.apply(make_bundle(2, V2), host.load_state())

    assert outcome.status == FAILED
    assert outcome.message == ("#2 failed (reload exited 1); restored #1 but reload exited 1")
    assert tree(host.target) == files_before  # still the old files, never a mix


def test_reload_failure_then_start_success_is_succeeded(host, on_v1):
    start, start_log = counting(host.tmp_path, "start")
    applier = host.applier(validate="true", reload="false", start=start)
    state = host.load_state()

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == SUCCEEDED
    assert runs(start_log) == ["2"]
    assert text_tree(host.target) == {**V2}
    assert state.active_number == 2


def test_reload_and_start_both_failing_restores_and_starts_the_old_files(host, on_v1):
    files_before, _ = on_v1
    start = script(host.tmp_path, "start.sh", "grep -q BROKEN $T/nginx.conf && exit 1\nexit 0\n")
    applier = host.applier(validate="true", reload="false", start=start)

    outcome = applier.apply(make_bundle(2, V2), host.load_state())

    assert outcome.status == WARNING
    assert "start exited 1" in outcome.message
    assert tree(host.target) == files_before


# --- nothing to restore: the safe fallback ---------------------------------------------------


def test_first_snapshot_failing_validation_writes_the_fallback_and_warns(host):
    reload, reload_log = counting(host.tmp_path, "reload")
    applier = host.applier(validate=rejects_broken(host.tmp_path), reload=reload)
    state = host.load_state()

    outcome = applier.apply(make_bundle(1, V2, fallback=FALLBACK), state)

    assert outcome.status == WARNING
    assert "wrote the safe fallback" in outcome.message
    assert text_tree(host.target) == FALLBACK  # none of #1's files are left
    assert runs(reload_log) == ["1"]
    saved = host.load_state()
    assert saved.active_number is None and saved.in_progress is None
    assert saved.managed_files == sorted(FALLBACK)
    assert temp_files(host.target, host.state_dir) == []


def test_first_snapshot_failing_without_a_fallback_is_failed_and_leaves_nothing(host):
    (host.target / "README.unmanaged").write_bytes(b"\xff\xfe was here before")
    before = tree(host.target)

    outcome = host.applier(validate="false").apply(make_bundle(1, V2), host.load_state())

    assert outcome.status == FAILED
    assert "nothing to restore and no fallback" in outcome.message
    assert tree(host.target) == before


def test_first_snapshot_failing_restores_a_preexisting_unmanaged_file_byte_for_byte(host):
    (host.target / "nginx.conf").write_bytes(b"distro default \xff\x00\r\n")
    before = tree(host.target)

    outcome = host.applier(validate="false").apply(
        make_bundle(1, V2, fallback=FALLBACK), host.load_state())

    # The host's own working config comes back (and is reloaded), not the fallback.
    assert outcome.status == WARNING
    assert "restored the files that were there" in outcome.message
    assert tree(host.target) == before


def test_fallback_failing_validation_too_is_failed(host):
    applier = host.applier(validate="false")

    outcome = applier.apply(make_bundle(1, V2, fallback=FALLBACK), host.load_state())

    assert outcome.status == FAILED
    assert "the safe fallback failed too (validate exited 1)" in outcome.message
    assert "conf.d/new-only.conf" not in tree(host.target)


def test_the_next_good_snapshot_replaces_the_fallback_files(host):
    applier = host.applier(validate=rejects_broken(host.tmp_path))
    state = host.load_state()
    assert applier.apply(make_bundle(1, V2, fallback=FALLBACK), state).status == WARNING

    outcome = applier.apply(make_bundle(2, V1, fallback=FALLBACK), state)

    assert outcome.status == SUCCEEDED
    assert text_tree(host.target) == V1


# --- what the commands see ------------------------------------------------------------------


def test_commands_run_in_the_agents_run_dir_with_target_and_snapshot_in_the_environment(host):
    seen = host.tmp_path / "seen"
    record = script(host.tmp_path, "record.sh",
                    f'printf "%s|%s|%s|%s\\n" "$1" "$BELLWETHER_TARGET_DIR" '
                    f'"$BELLWETHER_SNAPSHOT" "$(pwd -P)" >> {shlex.quote(str(seen))}\n')
    applier = host.applier(validate=f"{record} validate", reload=f"{record} reload",
                           environ={"PATH": os.environ["PATH"]})

    assert applier.apply(make_bundle(3, V1), host.load_state()).status == SUCCEEDED

    target = str(host.target)
    run_dir = os.path.realpath(host.state_dir / "run")
    assert seen.read_text().splitlines() == [f"validate|{target}|3|{run_dir}",
                                             f"reload|{target}|3|{run_dir}"]


def test_commands_get_the_agents_variables_named_by_command_env_only(host):
    validate = 'test "$SERVICE_NAME" = nginx && test -z "$NOT_PASSED"'
    environ = {**os.environ, "SERVICE_NAME": "nginx", "NOT_PASSED": "x"}

    good = host.applier(validate=validate, environ=environ, passthrough_env=("SERVICE_NAME",))
    bad = host.applier(validate=validate, environ=environ)

    assert good.apply(make_bundle(1, V1), host.load_state()).status == SUCCEEDED
    assert bad.apply(make_bundle(2, V2), host.load_state()).status == WARNING


def test_a_command_exceeding_its_timeout_counts_as_failed(host, on_v1):
    files_before, _ = on_v1
    applier = host.applier(validate="sleep 10", timeout_s=0.3)

    started = time.monotonic()
    outcome = applier.apply(make_bundle(2, V2), host.load_state())

    assert time.monotonic() - started < 5
    assert outcome.status == WARNING
    assert "validate timed out" in outcome.message
    assert tree(host.target) == files_before


@pytest.mark.slow
def test_a_timed_out_command_is_killed_with_its_children(host, on_v1):
    marker = host.tmp_path / "late-action"
    slow = script(host.tmp_path, "slow-check.sh",
                  f"sleep 0.3\necho too late > {shlex.quote(str(marker))}\n")
    applier = host.applier(validate=f"{slow} && echo validated", timeout_s=0.1)

    outcome = applier.apply(make_bundle(2, V2), host.load_state())
    deadline = time.monotonic() + 1.0
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)

    assert outcome.status == WARNING
    assert not marker.exists(), "the timed-out validate command was still running"


# --- errors while writing ---------------------------------------------------------------------


def test_an_error_while_writing_restores_the_old_files_and_reports(host, on_v1):
    files_before, state_before = on_v1
    # An unmanaged, non-empty directory where #2 wants a file: the rename fails
    # after other files of #2 may already be in place.
    (host.target / "zz-blocker.conf").mkdir()
    (host.target / "zz-blocker.conf" / "keep").write_text("keep")
    files_before = tree(host.target)

    outcome = host.applier().apply(make_bundle(2, {**V2, "zz-blocker.conf": "x"}),
                                   host.load_state())

    # Restored #1, and reloading it (no reload command here) succeeded.
    assert outcome.status == WARNING
    assert outcome.message.startswith("#2 failed (writing failed: ")
    assert outcome.message.endswith("; restored #1")
    assert tree(host.target) == files_before
    assert host.load_state().in_progress is None


def test_a_file_that_becomes_a_directory_in_the_next_snapshot_applies(host):
    applier, state = host.applier(), host.load_state()
    assert applier.apply(make_bundle(1, {"site": "single file\n"}), state).status == SUCCEEDED

    outcome = applier.apply(make_bundle(2, {"site/main.conf": "split\n"}), state)

    assert outcome.status == SUCCEEDED
    assert text_tree(host.target) == {"site/main.conf": "split\n"}
