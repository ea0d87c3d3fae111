"""agent/runner.py Agent against a local HTTP server speaking the agent protocol, so
agent/client.py Client is exercised too: polling with ETags, applying, reports,
push deployments, blocked snapshots, unsent reports, exit codes, backoff."""

from __future__ import annotations

import pytest

from agent.apply import FAILED, SUCCEEDED, WARNING
from agent.client import Client, ProtocolError, Unauthorized, Unreachable
from agent.runner import (
    EXIT_APPLY_FAILED,
    EXIT_BLOCKED,
    EXIT_NOTHING_DESIRED,
    EXIT_OK,
    EXIT_UNAUTHORIZED,
    EXIT_UNREACHABLE,
    MAX_BACKOFF,
)
from tests.agent.support import closed_port, counting, make_bundle, runs, script, text_tree

V1 = {"nginx.conf": "worker_processes 2;\n", "conf.d/shop.conf": "listen 80;\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/shop.conf": "listen 8080;\n"}
BROKEN = {"nginx.conf": "BROKEN\n"}
PUSH_ID = "6f1c1a8e-0d7e-4c55-9a51-2f3c4b5d6e7f"


class Stop(Exception):
    """Raised from an injected sleep to end Agent.run()."""


def report(bundle, status=SUCCEEDED, message=None, deployment_id=None) -> dict:
    return {"deployment_id": deployment_id, "snapshot": bundle["number"],
            "checksum": bundle["checksum"], "status": status,
            "message": message or f"applied #{bundle['number']} ({len(bundle['files'])} file(s))"}


def rejects_broken(tmp_path):
    return script(tmp_path, "validate.sh", "grep -q BROKEN $T/nginx.conf && exit 1\nexit 0\n")


def change_etag_only(server):
    """The desired body changes (so a 200, not a 304) but not the snapshot or push."""
    server.desired = dict(server.desired, poll_interval_s=server.desired["poll_interval_s"] + 1)


# --- first cycle, 304 -----------------------------------------------------------------------


def test_first_cycle_applies_the_desired_snapshot_and_reports_succeeded(host, server):
    bundle = server.publish(make_bundle(1, V1))
    agent = host.agent(server.url)

    assert agent.run_once() == EXIT_OK

    assert text_tree(host.target) == V1
    assert server.reports == [report(bundle)]
    headers = server.calls("desired")[0][3]
    assert headers["Authorization"] == f"Bearer {server.token}"
    assert "If-None-Match" not in headers
    assert [c[1] for c in server.calls("bundle")] == ["/api/v1/agent/snapshots/1/bundle"]
    saved = host.load_state()
    assert (saved.active_number, saved.etag, saved.unsent_report) == (1, server.etag(), None)


def test_an_unchanged_desired_state_304_applies_nothing_and_sends_no_report(host, server):
    server.publish(make_bundle(1, V1))
    validate, validate_log = counting(host.tmp_path, "validate")
    agent = host.agent(server.url, validate=validate)
    assert agent.run_once() == EXIT_OK

    assert agent.cycle() is None
    assert agent.run_once() == EXIT_OK

    desired_calls = server.calls("desired")
    assert [c[3].get("If-None-Match") for c in desired_calls] == [None] + [server.etag()] * 2
    assert len(server.calls("bundle")) == 1
    assert len(server.reports) == 1
    assert runs(validate_log) == ["1"]


def test_no_snapshot_desired_yet_writes_nothing_and_reports_nothing(host, server):
    agent = host.agent(server.url)

    assert agent.run_once() == EXIT_NOTHING_DESIRED

    assert text_tree(host.target) == {}
    assert server.reports == []
    assert host.load_state().etag == server.etag()


def test_a_new_snapshot_is_applied_on_the_next_poll(host, server):
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url)
    agent.run_once()
    bundle = server.publish(make_bundle(2, V2))

    outcome = agent.cycle()

    assert outcome.status == SUCCEEDED
    assert text_tree(host.target) == V2
    assert server.reports[-1] == report(bundle)


def test_in_sync_after_a_200_without_a_push_applies_nothing(host, server):
    server.publish(make_bundle(1, V1))
    validate, validate_log = counting(host.tmp_path, "validate")
    agent = host.agent(server.url, validate=validate)
    agent.run_once()
    change_etag_only(server)

    assert agent.cycle() is None

    assert runs(validate_log) == ["1"]
    assert len(server.reports) == 1
    assert host.load_state().etag == server.etag()


# --- push deployments ---------------------------------------------------------------------


def test_a_push_is_applied_once_and_a_second_announcement_only_resends_its_report(
        host, server):
    bundle = server.publish(make_bundle(1, V1), deployment_id=PUSH_ID)
    validate, validate_log = counting(host.tmp_path, "validate")
    agent = host.agent(server.url, validate=validate)
    assert agent.run_once() == EXIT_OK
    change_etag_only(server)  # the same push announced again

    assert agent.cycle() is None

    assert runs(validate_log) == ["1"]
    assert len(server.calls("bundle")) == 1
    expected = report(bundle, deployment_id=PUSH_ID)
    assert server.reports == [expected, expected]
    assert host.load_state().processed_deployments == {PUSH_ID: expected}


def test_a_push_is_remembered_across_a_restart(host, server):
    server.publish(make_bundle(1, V1), deployment_id=PUSH_ID)
    validate, validate_log = counting(host.tmp_path, "validate")
    host.agent(server.url, validate=validate).run_once()
    change_etag_only(server)

    assert host.agent(server.url, validate=validate).run_once() == EXIT_OK

    assert runs(validate_log) == ["1"]
    assert [r["deployment_id"] for r in server.reports] == [PUSH_ID, PUSH_ID]


def test_a_push_of_the_active_snapshot_is_applied_again(host, server):
    bundle = server.publish(make_bundle(1, V1))
    validate, validate_log = counting(host.tmp_path, "validate")
    agent = host.agent(server.url, validate=validate)
    agent.run_once()
    server.publish(bundle, deployment_id=PUSH_ID)

    assert agent.cycle().status == SUCCEEDED

    assert runs(validate_log) == ["1", "1"]
    assert server.reports[-1] == report(bundle, deployment_id=PUSH_ID)


def test_a_failed_push_is_recorded_and_not_applied_again(host, server):
    server.publish(make_bundle(1, V1))
    validate, validate_log = counting(host.tmp_path, "validate")
    agent = host.agent(server.url, validate=validate)
    agent.run_once()
    failing = script(host.tmp_path, "v.sh", f"{validate}\ngrep -q BROKEN $T/nginx.conf && exit 1\n"
                                            "exit 0\n")
    agent.applier.commands.validate = failing
    server.publish(make_bundle(2, BROKEN), deployment_id=PUSH_ID)

    assert agent.run_once() == EXIT_APPLY_FAILED
    change_etag_only(server)
    assert agent.cycle() is None

    assert runs(validate_log) == ["1", "2"]
    assert [r["status"] for r in server.reports] == [SUCCEEDED, WARNING, WARNING]
    assert server.reports[1] == server.reports[2]


# --- blocked snapshots ----------------------------------------------------------------------


def test_a_failed_snapshot_is_blocked_until_the_desired_snapshot_changes(host, server):
    server.publish(make_bundle(1, V1))
    validate = rejects_broken(host.tmp_path)
    reload, reload_log = counting(host.tmp_path, "reload")
    agent = host.agent(server.url, validate=validate, reload=reload)
    agent.run_once()
    bad = server.publish(make_bundle(2, BROKEN))

    assert agent.run_once() == EXIT_APPLY_FAILED
    assert host.load_state().blocked == {"number": 2, "checksum": bad["checksum"]}
    change_etag_only(server)
    assert agent.run_once() == EXIT_BLOCKED  # not applied again, not reported again

    assert text_tree(host.target) == V1
    assert len(server.calls("bundle")) == 2
    assert [r["status"] for r in server.reports] == [SUCCEEDED, WARNING]
    assert runs(reload_log) == ["1", "1"]  # #1 applied, #1 reloaded after the restore

    good = server.publish(make_bundle(3, V2))
    assert agent.run_once() == EXIT_OK
    assert text_tree(host.target) == V2
    assert server.reports[-1] == report(good)
    assert host.load_state().blocked is None


def test_a_failed_push_answered_again_is_blocked_not_in_sync(host, server):
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url)
    agent.run_once()
    server.publish(make_bundle(2, BROKEN), deployment_id=PUSH_ID)
    agent = host.agent(server.url, validate=rejects_broken(host.tmp_path))

    assert agent.run_once() == EXIT_APPLY_FAILED
    change_etag_only(server)  # the same push, answered again
    assert agent.run_once() == EXIT_BLOCKED

    assert f"push {PUSH_ID} was already applied" in agent.summary
    assert "an operator pushes #2 again" in agent.summary
    assert text_tree(host.target) == V1


def test_a_blocked_number_is_retried_when_its_checksum_changes(host, server):
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url, validate=rejects_broken(host.tmp_path))
    agent.run_once()
    server.publish(make_bundle(2, BROKEN))
    assert agent.run_once() == EXIT_APPLY_FAILED

    fixed = server.publish(make_bundle(2, {"nginx.conf": "fixed\n"}))

    assert agent.run_once() == EXIT_OK
    assert text_tree(host.target) == {"nginx.conf": "fixed\n"}
    assert server.reports[-1] == report(fixed)


def test_a_bundle_that_is_not_the_announced_snapshot_fails_and_blocks(host, server):
    bundle = make_bundle(1, V1)
    server.publish(bundle, announced_checksum="sha256:" + "0" * 64)
    agent = host.agent(server.url)

    assert agent.run_once() == EXIT_APPLY_FAILED

    assert text_tree(host.target) == {}
    assert server.reports == [{"deployment_id": None, "snapshot": 1,
                               "checksum": "sha256:" + "0" * 64, "status": FAILED,
                               "message": "#1: the bundle is not the announced snapshot"}]
    assert host.load_state().blocked == {"number": 1, "checksum": "sha256:" + "0" * 64}


def test_a_push_of_a_blocked_snapshot_gets_a_report(host, server):
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url, validate=rejects_broken(host.tmp_path))
    agent.run_once()
    bad = server.publish(make_bundle(2, BROKEN))
    assert agent.run_once() == EXIT_APPLY_FAILED
    server.publish(bad, deployment_id=PUSH_ID)  # an operator pushes it explicitly

    agent.run_once()

    assert [r["deployment_id"] for r in server.reports] == [None, None, PUSH_ID]


# --- reports that cannot be sent -------------------------------------------------------------


def test_a_report_refused_with_500_is_kept_and_sent_after_a_restart(host, server):
    bundle = server.publish(make_bundle(1, V1))
    server.fail("reports", 500)

    assert host.agent(server.url).run_once() == EXIT_UNREACHABLE

    assert text_tree(host.target) == V1  # applied; only the report is pending
    kept = host.load_state()
    assert kept.unsent_report == report(bundle)
    assert kept.etag is None  # not handled to the end: the next poll is a full one

    assert host.agent(server.url).run_once() == EXIT_OK  # a new process, state from disk

    assert server.accepted == [report(bundle)]
    assert host.load_state().unsent_report is None


def test_a_report_lost_to_a_dropped_connection_is_sent_on_the_next_cycle(host, server):
    bundle = server.publish(make_bundle(1, V1))
    server.fail("reports", "drop")
    agent = host.agent(server.url)

    with pytest.raises(Unreachable):
        agent.cycle()
    assert agent.state.unsent_report == report(bundle)

    assert agent.cycle() is None
    assert server.accepted == [report(bundle)]
    assert host.load_state().unsent_report is None


@pytest.mark.parametrize("status", [429, 503])
def test_a_report_answered_with_a_retryable_status_is_kept(host, server, status):
    bundle = server.publish(make_bundle(1, V1))
    server.fail("reports", status)
    agent = host.agent(server.url)

    with pytest.raises(ProtocolError):
        agent.cycle()

    assert host.load_state().unsent_report == report(bundle)


def test_an_unsent_report_waits_while_the_server_is_down_and_goes_out_when_it_is_back(
        host, server):
    bundle = make_bundle(1, V1)
    state = host.load_state()
    state.unsent_report = report(bundle)
    host.save(state)
    server.stop()

    assert host.agent(server.url).run_once() == EXIT_UNREACHABLE
    assert host.load_state().unsent_report == report(bundle)

    server.start()  # the same port again
    assert host.agent(server.url).run_once() == EXIT_NOTHING_DESIRED
    assert server.accepted[0] == report(bundle)
    assert host.load_state().unsent_report is None


def test_a_report_refused_with_409_is_dropped_not_retried_forever(host, server):
    server.publish(make_bundle(1, V1))
    server.fail("reports", 409)
    agent = host.agent(server.url)

    assert agent.run_once() == EXIT_OK
    assert host.load_state().unsent_report is None
    change_etag_only(server)
    assert agent.run_once() == EXIT_OK

    assert len(server.reports) == 1
    assert server.accepted == []


def test_a_401_on_a_report_keeps_it_and_exits_unauthorized(host, server):
    bundle = server.publish(make_bundle(1, V1))
    server.fail("reports", 401)

    assert host.agent(server.url).run_once() == EXIT_UNAUTHORIZED

    assert host.load_state().unsent_report == report(bundle)


# --- the ETag is stored only once the desired state was handled ---------------------------


def test_the_etag_is_stored_only_after_the_desired_state_was_handled(host, server):
    server.publish(make_bundle(1, V1))
    server.fail("bundle", 500)
    agent = host.agent(server.url)

    assert agent.run_once() == EXIT_UNREACHABLE
    assert agent.state.etag is None and host.load_state().etag is None
    assert text_tree(host.target) == {}

    assert agent.run_once() == EXIT_OK
    assert server.calls("desired")[-1][3].get("If-None-Match") is None
    assert text_tree(host.target) == V1
    assert host.load_state().etag == server.etag()


def test_the_etag_header_is_read_case_insensitively(host, server):
    server.etag_header = "etag"
    server.publish(make_bundle(1, V1))

    host.agent(server.url).run_once()

    assert host.load_state().etag == server.etag()


# --- exit codes -----------------------------------------------------------------------------


def test_run_once_exits_1_on_a_warning(host, server):
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url, validate=rejects_broken(host.tmp_path))
    agent.run_once()
    server.publish(make_bundle(2, BROKEN))

    assert agent.run_once() == EXIT_APPLY_FAILED
    assert server.reports[-1]["status"] == WARNING


def test_run_once_exits_1_on_a_failure(host, server):
    server.publish(make_bundle(1, V1))

    assert host.agent(server.url, validate="false").run_once() == EXIT_APPLY_FAILED
    assert server.reports[-1]["status"] == FAILED


def test_run_once_exits_3_when_the_server_refuses_the_token(host, server):
    server.publish(make_bundle(1, V1))

    assert host.agent(server.url, token="bwa_revoked").run_once() == EXIT_UNAUTHORIZED
    assert text_tree(host.target) == {}


def test_run_once_exits_4_when_the_server_is_unreachable(host):
    assert host.agent(f"http://127.0.0.1:{closed_port()}").run_once() == EXIT_UNREACHABLE


def test_run_once_exits_4_when_the_server_fails(host, server):
    server.fail("desired", 503)

    assert host.agent(server.url).run_once() == EXIT_UNREACHABLE


def test_a_200_that_is_not_json_counts_as_a_failing_server(host, server):
    server.raw_desired = b"<html>maintenance</html>"

    assert host.agent(server.url).run_once() == EXIT_UNREACHABLE


# --- run(): intervals and backoff ----------------------------------------------------------


def test_run_polls_at_the_servers_interval_with_jitter(host, server):
    server.publish(make_bundle(1, V1))
    server.desired["poll_interval_s"] = 10
    delays = []
    jitter = iter([0.0, 1.0, 0.5])

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) == 3:
            raise Stop

    with pytest.raises(Stop):
        host.agent(server.url, sleep=sleep, rng=lambda: next(jitter)).run()

    assert delays == pytest.approx([9.0, 11.0, 10.0])


def test_a_configured_poll_interval_overrides_the_servers(host, server):
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        raise Stop

    with pytest.raises(Stop):
        host.agent(server.url, sleep=sleep, poll_interval=60).run()

    assert delays == [60.0]


def test_run_backs_off_with_growing_delays_and_keeps_the_current_files(host, server):
    server.publish(make_bundle(1, V1))
    host.agent(server.url).run_once()
    state_before = host.load_state()
    server.stop()
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) == 12:
            raise Stop

    with pytest.raises(Stop):
        host.agent(server.url, sleep=sleep, rng=lambda: 1.0).run()

    assert delays == [2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0] + [MAX_BACKOFF] * 4
    assert text_tree(host.target) == V1
    assert host.load_state() == state_before


def test_backoff_is_jittered_down_to_half(host):
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) == 3:
            raise Stop

    with pytest.raises(Stop):
        host.agent(f"http://127.0.0.1:{closed_port()}", sleep=sleep, rng=lambda: 0.0).run()

    assert delays == [1.0, 2.0, 4.0]


def test_run_returns_to_the_poll_interval_once_the_server_is_back(host, server):
    server.publish(make_bundle(1, V1))
    server.stop()
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) == 3:
            server.start()
        if len(delays) == 5:
            raise Stop

    with pytest.raises(Stop):
        host.agent(server.url, sleep=sleep, rng=lambda: 0.5).run()

    assert delays == [1.5, 3.0, 6.0, 10.0, 10.0]
    assert text_tree(host.target) == V1


def test_run_backs_off_on_server_errors_too(host, server):
    server.fail("desired", 500, 503)
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) == 3:
            raise Stop

    with pytest.raises(Stop):
        host.agent(server.url, sleep=sleep, rng=lambda: 1.0).run()

    assert delays == [2.0, 4.0, 11.0]  # then the poll interval, 10 s + 10 % jitter


def test_run_stops_with_3_when_the_token_is_refused(host, server):
    assert host.agent(server.url, token="bwa_revoked").run() == EXIT_UNAUTHORIZED


def test_after_a_restart_the_agent_polls_at_the_servers_interval(host, server):
    server.publish(make_bundle(1, V1))
    server.desired["poll_interval_s"] = 10
    host.agent(server.url).run_once()
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        raise Stop

    with pytest.raises(Stop):
        host.agent(server.url, sleep=sleep, rng=lambda: 0.5).run()

    assert delays == [10.0]


# --- the client on its own ----------------------------------------------------------------


def test_client_error_envelope_becomes_a_protocol_error_with_status_and_code(server):
    server.fail("desired", 409)

    with pytest.raises(ProtocolError) as error:
        Client(server.url, token=server.token, timeout=5).desired(None)

    assert (error.value.status, error.value.code) == (409, "injected")
    assert str(error.value) == "HTTP 409 injected: injected 409"


def test_client_401_is_unauthorized(server):
    with pytest.raises(Unauthorized) as error:
        Client(server.url, token="wrong", timeout=5).desired(None)

    assert error.value.code == "invalid_token"


def test_client_enroll_posts_name_and_labels_and_returns_the_token(server):
    answer = Client(server.url, timeout=5).enroll(server.ENROLLMENT_TOKEN, "web-1",
                                                  {"role": "web"})

    assert answer["token"] == server.token
    assert server.enrolled == [{"enrollment_token": server.ENROLLMENT_TOKEN, "name": "web-1",
                                "labels": {"role": "web"}}]
    assert "Authorization" not in server.calls("enroll")[0][3]
