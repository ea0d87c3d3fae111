"""A crash between writing the files and reloading: a real agent process is killed
(SIGKILL, from its own validate command) after the new files are in place. On
restart recover_interrupted must put the old files back (never a mix of old and
new), leave no temp files, and the next apply of the same snapshot finishes."""

from __future__ import annotations

import os
import signal

import pytest

from agent import files as fs
from agent.apply import SUCCEEDED
from agent.files import TEMP_MARKER
from tests.agent.support import (
    apply_in_a_process,
    counting,
    make_bundle,
    runs,
    temp_files,
    text_tree,
    tree,
)

V1 = {"nginx.conf": "worker_processes 2;\n", "conf.d/shop.conf": "listen 80;\n",
      "old-only.conf": "only in #1\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/shop.conf": "listen 8080;\n",
      "conf.d/deep/new-only.conf": "only in #2\n"}
# The agent runs validate after writing and before reloading; `sleep` so validate
# cannot report back before the kill lands.
KILL_THE_AGENT = "kill -9 $PPID; sleep 2"


def crash_while_applying(host, bundle):
    result = apply_in_a_process(host.tmp_path, host.target, host.state_dir, bundle,
                                validate=KILL_THE_AGENT)
    assert result.returncode == -signal.SIGKILL, (result.returncode, result.stderr)
    return result


@pytest.fixture
def crashed_on_v2(host):
    """#1 active; an apply of #2 killed after writing its files, before reloading."""
    host.applier().apply(make_bundle(1, V1), host.load_state())
    before = tree(host.target)
    crash_while_applying(host, make_bundle(2, V2))
    return before


def test_the_crash_happens_after_the_new_files_were_written(host, crashed_on_v2):
    # The premise of the other tests: the host is left with #2's files, not #1's.
    assert text_tree(host.target) == V2
    state = host.load_state()
    assert state.in_progress["number"] == 2
    assert state.active_number == 1


def test_recovery_restores_the_old_files_exactly_and_removes_new_only_files(
        host, crashed_on_v2):
    reload, reload_log = counting(host.tmp_path, "reload")
    state = host.load_state()

    message = host.applier(reload=reload).recover_interrupted(state)

    assert message == "an apply of #2 was interrupted; restored the previous files"
    assert tree(host.target) == crashed_on_v2
    assert runs(reload_log) == ["1"]  # the old files are what runs again
    assert temp_files(host.target, host.state_dir) == []


def test_recovery_clears_in_progress_on_disk_and_keeps_the_active_snapshot(
        host, crashed_on_v2):
    state = host.load_state()

    host.applier().recover_interrupted(state)

    saved = host.load_state()
    assert saved.in_progress is None and state.in_progress is None
    assert (saved.active_number, saved.managed_files) == (1, sorted(V1))


def test_after_recovery_the_same_snapshot_applies_to_the_end(host, crashed_on_v2):
    state = host.load_state()
    applier = host.applier(validate="true", reload="true")
    applier.recover_interrupted(state)

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == SUCCEEDED
    assert text_tree(host.target) == V2
    assert host.load_state().active_number == 2
    assert temp_files(host.target, host.state_dir) == []


def test_recovery_after_a_crash_in_the_very_first_apply_leaves_no_new_files(host):
    (host.target / "preexisting.conf").write_bytes(b"distro default\n")
    crash_while_applying(host, make_bundle(1, {**V2, "preexisting.conf": "managed now\n"}))
    reload, reload_log = counting(host.tmp_path, "reload")
    state = host.load_state()

    host.applier(reload=reload).recover_interrupted(state)

    assert tree(host.target) == {"preexisting.conf": b"distro default\n"}
    assert runs(reload_log) == []  # nothing was active: nothing to reload
    assert host.load_state().in_progress is None


def test_recovery_is_idempotent_if_the_agent_crashes_again_while_recovering(
        host, crashed_on_v2):
    interrupted = host.load_state()
    host.applier().recover_interrupted(host.load_state())
    host.save(interrupted)  # as if that recovery had died before clearing in_progress

    host.applier().recover_interrupted(host.load_state())

    assert tree(host.target) == crashed_on_v2
    assert host.load_state().in_progress is None


def test_recovery_removes_temp_files_left_by_an_interrupted_write(host):
    host.applier().apply(make_bundle(1, V1), host.load_state())
    key = (host.state_dir / "temp-key").read_text()
    (host.target / "conf.d" / f".shop.conf{TEMP_MARKER}{key}-1a2b3c4d").write_text("half a fi")
    (host.target / f".nginx.conf{TEMP_MARKER}{key}-deadbeef").write_text("")
    before_state = host.load_state()

    message = host.applier().recover_interrupted(host.load_state())

    assert message == "removed 2 leftover temp file(s)"
    assert temp_files(host.target) == []
    assert text_tree(host.target) == V1
    assert host.load_state() == before_state


def test_recovery_leaves_alone_a_snapshot_file_named_like_a_temp_file(host):
    shipped = {**V1, f"conf.d/.shop.conf{TEMP_MARKER}1a2b3c4d": "shipped by the snapshot\n",
               f"x{TEMP_MARKER}0000000000000000-1": "also shipped\n"}
    host.applier().apply(make_bundle(1, shipped), host.load_state())
    # Another agent's (or an older agent's) leftovers are not this agent's either.
    (host.target / f".other{TEMP_MARKER}ffffffffffffffff-00000000").write_text("not mine")

    for _ in range(2):  # every start
        assert host.applier().recover_interrupted(host.load_state()) is None

    assert text_tree(host.target) == {**shipped,
                                      f".other{TEMP_MARKER}ffffffffffffffff-00000000": "not mine"}


def test_the_temp_key_is_kept_and_names_every_temp_file_of_this_agent(host, monkeypatch):
    first = host.applier().temp_key
    assert host.applier().temp_key == first
    assert len(first) == 16 and os.stat(host.state_dir / "temp-key").st_mode & 0o777 == 0o600
    names = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (names.append(str(path)),
                                                           real_open(path, *a, **k))[1])

    host.applier().apply(make_bundle(1, V1), host.load_state())

    temps = [n for n in names if TEMP_MARKER in n]
    assert temps and all(f"{TEMP_MARKER}{first}-" in n for n in temps)


def test_recovery_with_nothing_to_do_says_nothing(host):
    host.applier().apply(make_bundle(1, V1), host.load_state())

    assert host.applier().recover_interrupted(host.load_state()) is None
    assert text_tree(host.target) == V1


def test_recovery_after_a_crash_while_a_file_became_a_directory_restores(host):
    applier, state = host.applier(), host.load_state()
    applier.apply(make_bundle(1, {"site": "single file\n"}), state)
    # What an apply of #2 = {"site/main.conf"} leaves when the process dies after
    # the backup: in_progress set, "site" still the old file.
    manifest = fs.backup(str(host.target), ["site/main.conf", "site"], str(host.backup))
    state.in_progress = {"number": 2, "checksum": "sha256:x", "manifest": manifest}
    host.save(state)

    host.applier().recover_interrupted(host.load_state())

    assert text_tree(host.target) == {"site": "single file\n"}
    assert host.load_state().in_progress is None
