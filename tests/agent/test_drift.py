"""agent/drift.py: hand edits of managed files are found each cycle, reported when the
drifted set changes (and once after a start), summarised without secret values, and
under the restore policy the snapshot's files are applied again."""

from __future__ import annotations

import json
import os
import shlex
import stat
import time

import pytest

from agent import drift
from agent.drift import BUNDLE_FILE, UNRECORDED, diff_summary, drifted, written
from agent.runner import EXIT_APPLY_FAILED, EXIT_OK
from tests.agent.support import counting, make_bundle, runs, script, sealed, text_tree

V1 = {"nginx.conf": "worker_processes 2;\nevents {}\n", "conf.d/shop.conf": "listen 80;\n"}
SECRET_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHOP_DB": "db-pass-s3cr3t"}


def applied(host, server, *, policy: str = "report", files=None, **commands):
    """An agent that applied #1 (`files`, default V1) under the drift `policy`."""
    bundle = server.publish(make_bundle(1, files or V1))
    server.desired = dict(server.desired, drift_policy=policy)
    agent = host.agent(server.url, **commands)
    assert agent.run_once() == EXIT_OK, agent.summary
    return agent, bundle


def drift_report(bundle, files, restored=False) -> dict:
    return {"snapshot": bundle["number"], "checksum": bundle["checksum"], "files": files,
            "restored": restored}


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# --- found and reported --------------------------------------------------------------------


def test_nothing_is_reported_while_the_files_are_as_applied(host, server):
    agent, _ = applied(host, server)

    agent.run_once()
    agent.run_once()

    assert server.drift_reports == []


def test_a_hand_edit_is_reported_with_line_counts_once(host, server, caplog):
    agent, bundle = applied(host, server)
    (host.target / "nginx.conf").write_text("worker_processes 8;\nevents {}\nerror_log off;\n")

    with caplog.at_level("INFO", logger="agent.drift"):
        agent.run_once()  # 304: the files are checked all the same
        agent.run_once()
        agent.run_once()

    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert [r.getMessage() for r in warnings] == [
        "1 managed file(s) drifted from #1: nginx.conf"]  # once, not every cycle

    assert server.drift_reports == [drift_report(bundle, [
        {"path": "nginx.conf", "change": "modified", "summary": "+2 -1 lines"}])]
    assert host.load_state().drift == server.drift_reports[0]["files"]


def test_a_deleted_file_is_missing_and_a_chmod_is_a_mode_change(host, server):
    agent, bundle = applied(host, server)
    (host.target / "nginx.conf").unlink()
    os.chmod(host.target / "conf.d" / "shop.conf", 0o666)

    agent.run_once()

    assert server.drift_reports == [drift_report(bundle, [
        {"path": "conf.d/shop.conf", "change": "mode", "summary": "mode 0644 -> 0666"},
        {"path": "nginx.conf", "change": "missing", "summary": "file removed"}])]


def test_a_changed_set_is_reported_again_and_an_edit_undone_by_hand_clears_it(host, server):
    agent, bundle = applied(host, server)
    conf = host.target / "nginx.conf"
    conf.write_text("changed\n")
    agent.run_once()
    (host.target / "conf.d" / "shop.conf").unlink()
    agent.run_once()
    conf.write_text(V1["nginx.conf"])
    (host.target / "conf.d" / "shop.conf").write_text(V1["conf.d/shop.conf"])
    agent.run_once()
    agent.run_once()

    assert [[f["path"] for f in r["files"]] for r in server.drift_reports] == [
        ["nginx.conf"], ["conf.d/shop.conf", "nginx.conf"], []]


def test_drift_is_reported_again_after_a_restart_and_not_before(host, server):
    agent, _ = applied(host, server)
    (host.target / "nginx.conf").write_text("changed\n")
    agent.run_once()
    agent.run_once()

    restarted = host.agent(server.url)
    restarted.run_once()
    restarted.run_once()

    assert len(server.drift_reports) == 2
    assert server.drift_reports[0] == server.drift_reports[1]


def test_a_file_replaced_by_a_symlink_is_modified_and_not_followed(host, server, tmp_path):
    agent, _ = applied(host, server)
    outside = tmp_path / "elsewhere"
    outside.write_text("worker_processes 2;\nevents {}\n")  # the same content, elsewhere
    (host.target / "nginx.conf").unlink()
    (host.target / "nginx.conf").symlink_to(outside)

    agent.run_once()

    assert server.drift_reports[0]["files"] == [
        {"path": "nginx.conf", "change": "modified", "summary": "no longer a regular file"}]


def link_leaving_the_target(host, tmp_path):
    """conf.d moved aside and replaced by a link to a directory outside the target."""
    outside = tmp_path / "outside" / "conf.d"
    outside.mkdir(parents=True)
    (outside / "shop.conf").write_text('{"evil": true}')
    (host.target / "conf.d").rename(host.target / "conf.d.orig")
    (host.target / "conf.d").symlink_to(outside)
    return outside


def test_a_directory_replaced_by_a_link_leaving_the_target_is_drift(host, server, tmp_path):
    agent, bundle = applied(host, server)
    link_leaving_the_target(host, tmp_path)

    agent.run_once()

    assert server.drift_reports == [drift_report(bundle, [
        {"path": "conf.d/shop.conf", "change": "modified",
         "summary": "replaced by a link leaving the target"}])]


def test_a_restore_never_writes_through_a_link_leaving_the_target(host, server, tmp_path):
    agent, bundle = applied(host, server, policy="restore")
    outside = link_leaving_the_target(host, tmp_path)

    agent.run_once()

    assert (outside / "shop.conf").read_text() == '{"evil": true}'
    assert os.listdir(outside) == ["shop.conf"]
    assert server.drift_reports == [drift_report(bundle, [
        {"path": "conf.d/shop.conf", "change": "modified",
         "summary": "replaced by a link leaving the target"}], restored=False)]


def link_to_an_unmanaged_file(host):
    """nginx.conf replaced by a link to an unmanaged 0600 file inside the target."""
    leak = host.target / "leak.txt"
    leak.write_text("unmanaged\n")
    os.chmod(leak, 0o600)
    (host.target / "nginx.conf").unlink()
    (host.target / "nginx.conf").symlink_to("leak.txt")
    return leak


def test_a_restore_replaces_a_link_inside_the_target_never_writing_through_it(
        host, server, tmp_path):
    files = {"nginx.conf": f"db={sealed('env:SHOP_DB')}\n", "conf.d/shop.conf": "listen 80;\n"}
    agent, bundle = applied(host, server, policy="restore", files=files, environ=SECRET_ENV)
    leak = link_to_an_unmanaged_file(host)

    agent.run_once()
    agent.run_once()

    assert (leak.read_text(), mode_of(leak)) == ("unmanaged\n", 0o600)
    assert not (host.target / "nginx.conf").is_symlink()
    assert (host.target / "nginx.conf").read_text() == "db=db-pass-s3cr3t\n"
    assert server.drift_reports == [drift_report(bundle, [
        {"path": "nginx.conf", "change": "modified", "summary": "no longer a regular file"}],
        restored=True)]
    assert sorted(host.load_state().written) == ["conf.d/shop.conf", "nginx.conf"]


def test_a_new_apply_replaces_a_link_at_a_managed_path(host, server):
    agent, _ = applied(host, server)
    leak = link_to_an_unmanaged_file(host)
    server.publish(make_bundle(2, {"nginx.conf": "worker_processes 4;\n"}))

    assert agent.run_once() == EXIT_OK, agent.summary

    assert leak.read_text() == "unmanaged\n"
    assert (host.target / "nginx.conf").read_text() == "worker_processes 4;\n"
    assert not (host.target / "nginx.conf").is_symlink()


def test_a_managed_path_that_cannot_be_recorded_is_drift(host):
    (host.target / "leak.txt").write_text("x")
    (host.target / "site.conf").symlink_to("leak.txt")
    (host.target / "gone.conf").write_text("y")

    record = written(str(host.target), ["site.conf", "gone.conf"])
    (host.target / "gone.conf").unlink()

    assert record["site.conf"] == UNRECORDED
    assert drifted(str(host.target), record) == [
        {"path": "gone.conf", "change": "missing", "summary": "file removed"},
        {"path": "site.conf", "change": "modified", "summary": "no longer a regular file"}]
    (host.target / "site.conf").unlink()
    (host.target / "site.conf").write_text("x")
    assert drifted(str(host.target), record) == [
        {"path": "gone.conf", "change": "missing", "summary": "file removed"},
        {"path": "site.conf", "change": "modified",
         "summary": "not as the apply left it (it could not be recorded)"}]


def test_a_new_apply_records_the_new_files_and_forgets_the_drift(host, server):
    agent, _ = applied(host, server)
    (host.target / "nginx.conf").write_text("changed\n")
    agent.run_once()
    v2 = {"nginx.conf": "worker_processes 4;\n"}
    server.publish(make_bundle(2, v2))

    agent.run_once()  # applies #2 over the edit
    agent.run_once()

    assert text_tree(host.target) == v2
    assert len(server.drift_reports) == 1
    state = host.load_state()
    assert (state.drift, sorted(state.written)) == ([], ["nginx.conf"])


def test_no_drift_is_checked_while_a_snapshot_is_blocked(host, server, tmp_path):
    validate = script(tmp_path, "validate.sh", "grep -q BROKEN $T/nginx.conf && exit 1\nexit 0\n")
    agent, _ = applied(host, server, validate=validate)
    server.publish(make_bundle(2, {"nginx.conf": "BROKEN\n"}))
    assert agent.run_once() == EXIT_APPLY_FAILED
    assert host.load_state().blocked is not None
    (host.target / "nginx.conf").write_text("changed\n")

    agent.run_once()

    assert server.drift_reports == []


# --- secrets --------------------------------------------------------------------------------


def test_a_file_holding_a_secret_is_reported_without_content_or_diff(host, server):
    files = {"app.conf": f"db={sealed('env:SHOP_DB')}\n", "plain.conf": "x\n"}
    agent, bundle = applied(host, server, files=files, environ=SECRET_ENV)
    assert (host.target / "app.conf").read_text() == "db=db-pass-s3cr3t\n"
    (host.target / "app.conf").write_text("db=db-pass-s3cr3t\nuser=db-pass-s3cr3t-2\n")

    agent.run_once()

    assert server.drift_reports == [drift_report(bundle, [
        {"path": "app.conf", "change": "modified", "summary": "content changed"}])]
    state_dir = host.state_dir
    kept = (state_dir / BUNDLE_FILE).read_text()
    assert json.loads(kept) == bundle  # as sent: the sealed placeholder, not the value
    assert mode_of(state_dir / BUNDLE_FILE) == 0o600
    for text in (kept, (state_dir / "state.json").read_text(), json.dumps(server.drift_reports)):
        assert "db-pass" not in text


# --- restore --------------------------------------------------------------------------------


def test_the_restore_policy_applies_the_snapshot_again_and_reports_it_restored(
        host, server, tmp_path):
    reload, log = counting(tmp_path, "reload")
    agent, bundle = applied(host, server, policy="restore", reload=reload)
    (host.target / "nginx.conf").write_text("hand edit\n")
    os.chmod(host.target / "conf.d" / "shop.conf", 0o600)

    agent.run_once()
    agent.run_once()

    assert text_tree(host.target) == V1
    assert mode_of(host.target / "conf.d" / "shop.conf") == 0o644
    assert runs(log) == ["1", "1"]  # the apply, then the restore: reloaded
    assert server.drift_reports == [drift_report(bundle, [
        {"path": "conf.d/shop.conf", "change": "mode", "summary": "mode 0644 -> 0600"},
        {"path": "nginx.conf", "change": "modified", "summary": "+1 -2 lines"}],
        restored=True)]
    assert server.reports[1:] == []  # a restore is not an apply report
    assert host.load_state().drift == []


def test_a_deleted_file_is_restored_with_its_mode(host, server):
    agent, _ = applied(host, server, policy="restore")
    os.chmod(host.target / "nginx.conf", 0o640)
    agent.watch.check(agent.state)  # reports the mode change and restores it
    (host.target / "nginx.conf").unlink()

    agent.run_once()

    assert text_tree(host.target) == V1
    assert mode_of(host.target / "nginx.conf") == 0o644
    assert [r["restored"] for r in server.drift_reports] == [True, True]


def test_restoring_without_the_kept_bundle_fetches_it_again(host, server):
    agent, _ = applied(host, server, policy="restore")
    (host.state_dir / BUNDLE_FILE).unlink()
    (host.target / "nginx.conf").write_text("hand edit\n")
    fetched = len(server.calls("bundle"))

    agent.run_once()

    assert text_tree(host.target) == V1
    assert len(server.calls("bundle")) == fetched + 1
    assert server.drift_reports[0]["files"][0]["summary"] == "content changed"
    assert server.drift_reports[0]["restored"] is True


def test_a_restore_that_fails_is_reported_and_not_tried_again(host, server, tmp_path):
    marker = tmp_path / "reloaded-once"
    reload = script(tmp_path, "reload.sh",
                    f"echo run >> {shlex.quote(str(tmp_path / 'reload.log'))}\n"
                    f"[ -f {shlex.quote(str(marker))} ] && exit 1\n"
                    f"touch {shlex.quote(str(marker))}\n")
    agent, bundle = applied(host, server, policy="restore", reload=reload)
    (host.target / "nginx.conf").write_text("hand edit\n")

    agent.run_once()
    reloads = (tmp_path / "reload.log").read_text().count("run")
    agent.run_once()
    agent.run_once()

    assert (host.target / "nginx.conf").read_text() == "hand edit\n"  # the edit put back
    assert [(r["restored"], [f["path"] for f in r["files"]]) for r in server.drift_reports] == [
        (False, ["nginx.conf"])]
    assert (tmp_path / "reload.log").read_text().count("run") == reloads  # no retry loop


def failing_reload(tmp_path):
    """A reload that fails while `fail` exists (made by the caller), counting runs."""
    fail, log = tmp_path / "fail", tmp_path / "reload.log"
    reload = script(tmp_path, "reload.sh", f"echo run >> {shlex.quote(str(log))}\n"
                                           f"[ -f {shlex.quote(str(fail))} ] && exit 1\nexit 0\n")
    return reload, fail, lambda: log.read_text().count("run")


def test_a_failed_restore_is_tried_again_once_the_set_cleared_and_came_back(
        host, server, tmp_path, caplog):
    reload, fail, reloads = failing_reload(tmp_path)
    agent, _ = applied(host, server, policy="restore", reload=reload)
    fail.touch()
    (host.target / "nginx.conf").write_text("hand edit\n")
    agent.run_once()  # fails
    with caplog.at_level("INFO", logger="agent.drift"):
        agent.run_once()
        agent.run_once()
    skipped = [r.getMessage() for r in caplog.records if "not restoring" in r.getMessage()]
    before = reloads()
    fail.unlink()
    (host.target / "nginx.conf").write_text(V1["nginx.conf"])  # undone by hand
    agent.run_once()
    (host.target / "nginx.conf").write_text("hand edit\n")  # the same set again

    agent.run_once()

    assert skipped == ["not restoring #1's files again: restoring these files failed; "
                       "waiting for them, or the snapshot, to change"]  # once, at INFO
    assert reloads() == before + 1
    assert text_tree(host.target) == V1
    assert [(r["restored"], len(r["files"])) for r in server.drift_reports] == [
        (False, 1), (False, 0), (True, 1)]


def test_a_failed_restore_is_tried_again_after_another_set(host, server, tmp_path):
    reload, fail, _ = failing_reload(tmp_path)
    agent, _ = applied(host, server, policy="restore", reload=reload)
    fail.touch()
    (host.target / "nginx.conf").write_text("hand edit\n")
    agent.run_once()  # fails for {nginx.conf}
    os.chmod(host.target / "conf.d" / "shop.conf", 0o600)
    agent.run_once()  # fails for {nginx.conf, conf.d/shop.conf}
    fail.unlink()
    os.chmod(host.target / "conf.d" / "shop.conf", 0o644)  # back to {nginx.conf}

    agent.run_once()

    assert text_tree(host.target) == V1
    assert [(r["restored"], len(r["files"])) for r in server.drift_reports] == [
        (False, 1), (False, 2), (True, 1)]


def test_a_failed_restore_is_tried_again_after_a_new_snapshot(host, server, tmp_path):
    reload, fail, _ = failing_reload(tmp_path)
    agent, _ = applied(host, server, policy="restore", reload=reload)
    fail.touch()
    (host.target / "nginx.conf").write_text("hand edit\n")
    agent.run_once()  # fails for #1
    fail.unlink()
    v2 = dict(V1, **{"conf.d/shop.conf": "listen 8080;\n"})
    server.publish(make_bundle(2, v2))
    assert agent.run_once() == EXIT_OK  # applies #2 (no check in that cycle)
    (host.target / "nginx.conf").write_text("hand edit\n")  # the same set, under #2

    agent.run_once()

    assert text_tree(host.target) == v2
    assert [(r["snapshot"], r["restored"]) for r in server.drift_reports] == [
        (1, False), (2, True)]


def test_switching_to_restore_restores_a_drift_already_reported(host, server):
    agent, bundle = applied(host, server)
    (host.target / "nginx.conf").write_text("hand edit\n")
    agent.run_once()

    server.desired = dict(server.desired, drift_policy="restore")  # a new poll answer
    agent.run_once()

    assert text_tree(host.target) == V1
    assert [r["restored"] for r in server.drift_reports] == [False, True]


def test_a_drift_report_the_server_cannot_take_now_is_sent_again(host, server):
    agent, _ = applied(host, server)
    (host.target / "nginx.conf").write_text("hand edit\n")
    server.fail("drift", 503)

    agent.run_once()
    agent.run_once()

    assert [len(r["files"]) for r in server.drift_reports] == [1, 1]
    assert host.load_state().drift[0]["path"] == "nginx.conf"


def test_a_refused_drift_report_is_not_sent_again(host, server):
    agent, _ = applied(host, server)
    (host.target / "nginx.conf").write_text("hand edit\n")
    server.fail("drift", 409)

    agent.run_once()
    agent.run_once()

    assert len(server.drift_reports) == 1


# --- the pure parts -------------------------------------------------------------------------


@pytest.mark.parametrize(("expected", "actual", "summary"), [
    ("a\nb\n", b"a\nb\nc\n", "+1 -0 lines"),
    ("a\nb\n", b"a\n", "+0 -1 lines"),
    ("a\nb\n", b"a\nB\n", "+1 -1 lines"),
    ("a\n", b"a\r\n", "+1 -1 lines"),
    ("a\n", b"\xff\xfe", "content changed (not UTF-8 text)"),
    (None, b"x", "content changed"),
    ("a\n", b"x\n" * 600_000, "content changed (too large to compare)"),
])
def test_diff_summary_counts_lines_only(expected, actual, summary):
    assert diff_summary(expected, actual) == summary


def test_diff_summary_of_a_large_interleaved_edit_is_bounded():
    old = "".join(f"line {i}\n" for i in range(9_999))
    new = "".join(f"line {i}\nadded {i}\n" for i in range(9_999))

    started = time.monotonic()
    summary = diff_summary(old, new.encode())

    assert summary == "content changed (19998 lines, was 9999)"
    assert time.monotonic() - started < 10  # was 51.6 s; about 1 s on a slow host


def test_diff_summary_counts_a_small_edit_in_a_large_file():
    old = "".join(f"line {i}\n" for i in range(19_000))
    new = old.replace("line 7000\n", "changed\n").replace("line 12\n", "")

    assert diff_summary(old, (new + "end\n").encode()) == "+2 -2 lines"


def test_a_file_that_stays_drifted_is_diffed_once(host, server, monkeypatch):
    agent, _ = applied(host, server)
    diffs = []

    def counted(expected, actual):
        diffs.append(actual)
        return "+1 -1 lines"

    monkeypatch.setattr(drift, "diff_summary", counted)
    (host.target / "nginx.conf").write_text("hand edit\n")
    for _ in range(3):
        agent.run_once()
    (host.target / "nginx.conf").write_text("another edit\n")
    agent.run_once()
    agent.run_once()

    assert diffs == [b"hand edit\n", b"another edit\n"]


def test_a_recorded_path_outside_the_target_is_never_read(host, tmp_path):
    (tmp_path / "outside").write_text("x")
    record = written(str(tmp_path), ["outside"])

    assert drifted(str(host.target), {"../outside": record["outside"]}) == []
