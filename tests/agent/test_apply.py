"""agent/apply.py, the happy path and every refusal that must happen before anything
is written: checksum, lower number, secrets, paths leaving the target directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent.apply import (
    FAILED,
    SUCCEEDED,
    WARNING,
    content_checksum,
)
from agent.state import State
from tests.agent.support import entries, make_bundle, sealed, temp_files, text_tree, tree

V1 = {"nginx.conf": "worker_processes 2;\n", "conf.d/shop.conf": "server { listen 80; }\n",
      "old-only.conf": "only in #1\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/shop.conf": "server { listen 8080; }\n",
      "sites/deep/new.conf": "only in #2 — ünïcode\n"}


def applied(host, files=V1, number=1, **commands):
    """Apply `files` as snapshot `number`; returns (applier, state) for the next step."""
    applier, state = host.applier(**commands), host.load_state()
    outcome = applier.apply(make_bundle(number, files), state)
    assert outcome.status == SUCCEEDED, outcome
    return applier, state


def assert_untouched(host, before: dict, state_before: State) -> None:
    assert tree(host.target) == before
    assert host.load_state() == state_before
    assert temp_files(host.target) == []


# --- content_checksum -----------------------------------------------------------------


def test_content_checksum_is_sha256_over_path_sorted_pairs_and_ignores_order():
    files = entries({"b.conf": "b", "a.conf": "ä"})

    checksum = content_checksum(files)

    assert checksum.startswith("sha256:") and len(checksum) == 7 + 64
    assert checksum == content_checksum(list(reversed(files)))
    assert checksum != content_checksum(entries({"b.conf": "b", "a.conf": "a"}))


# --- success ---------------------------------------------------------------------------


def test_first_apply_writes_every_file_exactly_and_creates_directories(host):
    applier, state = host.applier(), host.load_state()

    outcome = applier.apply(make_bundle(1, V1, label="20250101-001"), state)

    assert outcome.status == SUCCEEDED
    assert outcome.message == "applied #1 (3 file(s))"
    assert text_tree(host.target) == V1
    assert temp_files(host.target, host.state_dir) == []


def test_apply_records_the_active_snapshot_in_the_state_on_disk(host):
    bundle = make_bundle(1, V1, label="20250101-001")

    host.applier().apply(bundle, host.load_state())

    state = host.load_state()
    assert (state.active_number, state.active_checksum, state.active_label) == (
        1, bundle["checksum"], "20250101-001")
    assert state.managed_files == sorted(V1)
    assert state.in_progress is None


def test_next_apply_replaces_changed_files_and_removes_files_the_snapshot_dropped(host):
    applier, state = applied(host, V1)
    (host.target / "unmanaged.txt").write_text("left alone")

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == SUCCEEDED
    assert text_tree(host.target) == {**V2, "unmanaged.txt": "left alone"}
    assert host.load_state().managed_files == sorted(V2)
    assert temp_files(host.target, host.state_dir) == []


def test_backup_holds_the_previous_versions_of_the_files_after_an_apply(host):
    applier, state = applied(host, V1)

    applier.apply(make_bundle(2, V2), state)

    backed_up = text_tree(host.backup)
    assert backed_up == {p: V1[p] for p in ("nginx.conf", "conf.d/shop.conf", "old-only.conf")}


def test_reapplying_the_active_snapshot_is_allowed(host):
    applier, state = applied(host, V1)
    (host.target / "nginx.conf").write_text("edited by hand\n")

    outcome = applier.apply(make_bundle(1, V1), state)

    assert outcome.status == SUCCEEDED
    assert text_tree(host.target) == V1


# --- refused before anything is written --------------------------------------------------


def test_checksum_mismatch_fails_and_writes_nothing(host):
    applier, state = applied(host, V1)
    before, state_before = tree(host.target), host.load_state()
    bundle = make_bundle(2, V2, checksum=content_checksum(entries(V1)))

    outcome = applier.apply(bundle, state)

    assert outcome.status == FAILED
    assert "do not match its checksum" in outcome.message
    assert_untouched(host, before, state_before)


def test_tampered_file_content_fails_the_checksum(host):
    applier, state = host.applier(), host.load_state()
    bundle = make_bundle(1, V1)
    bundle["files"][0]["content"] += "# injected\n"

    outcome = applier.apply(bundle, state)

    assert outcome.status == FAILED
    assert tree(host.target) == {}
    assert state.active_number is None and state.in_progress is None


def test_a_lower_number_than_the_active_one_fails_and_writes_nothing(host):
    applier, state = applied(host, V2, number=5)
    before, state_before = tree(host.target), host.load_state()

    outcome = applier.apply(make_bundle(4, V1), state)

    assert outcome.status == FAILED
    assert outcome.message == "refusing #4: lower than the active #5"
    assert_untouched(host, before, state_before)
    assert state.active_number == 5


def test_unresolvable_secrets_fail_before_anything_is_written_naming_every_reference(host):
    applier, state = applied(host, V1, environ={"PATH": os.environ["PATH"]})
    before, state_before = tree(host.target), host.load_state()
    bundle = make_bundle(2, {
        "nginx.conf": f"password {sealed('env:MISSING_PASSWORD')};\n",
        "tls/key.pem": sealed("file:/nonexistent/bellwether/key.pem"),
        "other.conf": f"{sealed('env:ALSO_MISSING')} {sealed('env:MISSING_PASSWORD')}",
        "vault.conf": sealed("vault:kv/app#token"),
    })

    outcome = applier.apply(bundle, state)

    assert outcome.status == FAILED
    for reference in ("env:MISSING_PASSWORD", "file:/nonexistent/bellwether/key.pem",
                      "env:ALSO_MISSING", "vault:kv/app#token"):
        assert reference in outcome.message
    assert "nothing was written" in outcome.message
    assert_untouched(host, before, state_before)


def test_env_and_file_secrets_are_substituted_at_write_time(host, tmp_path):
    secret_file = tmp_path / "db-password"
    secret_file.write_text("s3cr3t-from-file\n")
    applier = host.applier(environ={"PATH": os.environ["PATH"], "API_KEY": "k-123"})
    files = {"app.conf": f"key={sealed('env:API_KEY')}\npw={sealed(f'file:{secret_file}')}\n"}
    bundle = make_bundle(1, files)

    outcome = applier.apply(bundle, host.load_state())

    assert outcome.status == SUCCEEDED
    assert (host.target / "app.conf").read_text() == "key=k-123\npw=s3cr3t-from-file\n"
    # The checksum is the server's, over the placeholders: no secret reaches the state.
    assert host.load_state().active_checksum == content_checksum(entries(files))
    assert "k-123" not in Path(host.state_file).read_text()


@pytest.mark.parametrize("bad_path", ["../escaped.conf", "conf.d/../../escaped.conf",
                                      "/tmp/escaped-absolute.conf"])
def test_a_path_leaving_the_target_directory_fails_and_writes_nothing(host, bad_path):
    applier, state = applied(host, V1)
    before, state_before = tree(host.target), host.load_state()
    outside_before = sorted(os.listdir(host.tmp_path))

    outcome = applier.apply(make_bundle(2, {**V2, bad_path: "pwned\n"}), state)

    assert outcome.status == FAILED
    assert "leaves the target directory" in outcome.message
    assert_untouched(host, before, state_before)
    assert sorted(os.listdir(host.tmp_path)) == outside_before
    assert not os.path.exists("/tmp/escaped-absolute.conf")


def test_a_symlinked_directory_pointing_outside_fails_and_writes_nothing(host):
    outside = host.tmp_path / "outside"
    outside.mkdir()
    (host.target / "conf.d").symlink_to(outside)
    applier, state = host.applier(), host.load_state()

    outcome = applier.apply(make_bundle(1, {"nginx.conf": "x", "conf.d/evil.conf": "y"}),
                            state)

    assert outcome.status == FAILED
    assert "leaves the target directory" in outcome.message
    assert list(outside.iterdir()) == []
    assert not (host.target / "nginx.conf").exists()
    assert state.in_progress is None


def test_a_fallback_file_leaving_the_target_directory_fails_before_writing(host):
    applier, state = host.applier(), host.load_state()

    outcome = applier.apply(make_bundle(1, V1, fallback={"../fallback.conf": "503"}), state)

    assert outcome.status == FAILED
    assert tree(host.target) == {}
    assert not (host.tmp_path / "fallback.conf").exists()


def test_a_new_file_holding_a_resolved_secret_is_readable_by_its_owner_only(host):
    applier = host.applier(environ={"PATH": os.environ["PATH"], "API_KEY": "k-123"})
    files = {"app.conf": f"key={sealed('env:API_KEY')}\n", "plain.conf": "x\n"}

    assert applier.apply(make_bundle(1, files), host.load_state()).status == SUCCEEDED

    assert os.stat(host.target / "app.conf").st_mode & 0o777 == 0o600
    assert os.stat(host.target / "plain.conf").st_mode & 0o777 == 0o644


def test_replacing_a_file_keeps_its_mode_and_a_restore_brings_the_old_mode_back(host):
    applier, state = applied(host, V1)
    os.chmod(host.target / "nginx.conf", 0o640)

    assert applier.apply(make_bundle(2, V2), state).status == SUCCEEDED
    assert os.stat(host.target / "nginx.conf").st_mode & 0o777 == 0o640

    failing = host.applier(validate="false")
    assert failing.apply(make_bundle(3, V1), state).status == WARNING  # #2 restored
    assert os.stat(host.target / "nginx.conf").st_mode & 0o777 == 0o640
    assert (host.target / "nginx.conf").read_text() == V2["nginx.conf"]
