"""The health probe after a reload (agent/health.py, agent/apply.py): a command or a
URL, attempts apart by the interval, a timeout; an unhealthy service gets the
previous files back and reloaded, the report carries the probe's result, the
snapshot is blocked; configuration mistakes exit 2."""

from __future__ import annotations

import os
import shlex
import time
from http.server import BaseHTTPRequestHandler

import pytest

from agent.apply import FAILED, SUCCEEDED, WARNING
from agent.config import ConfigError, load
from agent.health import BODY_READ, OUTPUT_KEPT, Probe, check, shown, url_check
from agent.runner import EXIT_APPLY_FAILED, EXIT_CONFIG, EXIT_OK
from tests import ports
from tests.agent.support import counting, make_bundle, runs, script, sealed, text_tree
from tests.agent.test_cli import python_m_agent

V1 = {"nginx.conf": "worker_processes 2;\n"}
V2 = {"nginx.conf": "worker_processes 4;\n", "conf.d/new.conf": "only in #2\n"}


def unhealthy_on_v2(tmp_path) -> tuple:
    """A health command that fails while #2's content is in place (and logs each
    run's BELLWETHER_SNAPSHOT); returns (command, log)."""
    log = tmp_path / "health.log"
    command = script(tmp_path, "health.sh",
                     f'echo "$BELLWETHER_SNAPSHOT" >> {shlex.quote(str(log))}\n'
                     'if grep -q "worker_processes 4" "$T/nginx.conf"; then\n'
                     '  echo "checking upstream..."; echo "upstream shop: 502 Bad Gateway" >&2\n'
                     "  exit 1\nfi\necho healthy\n")
    return command, log


def applied_v1(host, **options):
    applier, state = host.applier(**options), host.load_state()
    assert applier.apply(make_bundle(1, V1), state).status == SUCCEEDED
    return applier, state


# --- the command probe ------------------------------------------------------------------


def test_a_healthy_service_succeeds_and_the_outcome_carries_the_probe(host):
    command, log = unhealthy_on_v2(host.tmp_path)
    reload, reload_log = counting(host.tmp_path, "reload")
    applier, state = host.applier(reload=reload, probe=Probe(command=command)), \
        host.load_state()

    outcome = applier.apply(make_bundle(1, V1), state)

    assert outcome.status == SUCCEEDED
    assert outcome.message == "applied #1 (1 file(s)); health command passed after 1 attempt(s)"
    assert outcome.health == {"ok": True, "attempts": 1, "output": "healthy",
                              "probe": "command"}
    assert runs(reload_log) == ["1"] and runs(log) == ["1"]  # after the reload, once


def test_an_unhealthy_service_after_every_attempt_gets_the_previous_files_back(host):
    command, log = unhealthy_on_v2(host.tmp_path)
    reload, reload_log = counting(host.tmp_path, "reload")
    waits = []
    applier, state = applied_v1(host, reload=reload, sleep=waits.append,
                                probe=Probe(command=command, attempts=3, interval_s=2.5))

    outcome = applier.apply(make_bundle(2, V2), state)

    # Restored and reloaded: a warning, which fails a rollout wave like `failed`.
    assert outcome.status == WARNING
    assert outcome.message.startswith("#2 failed (health command failed after 3 attempt(s): "
                                      "exited 1: checking upstream...")
    assert "upstream shop: 502 Bad Gateway" in outcome.message
    assert outcome.message.endswith("; restored #1")
    assert outcome.health == {"ok": False, "attempts": 3, "probe": "command",
                              "output": "exited 1: checking upstream...\n"
                                        "upstream shop: 502 Bad Gateway"}
    assert text_tree(host.target) == V1  # #2's new file removed too
    assert runs(log) == ["1", "2", "2", "2"]  # #1 once; #2 three times
    assert waits == [2.5, 2.5]  # between attempts, not after the last
    assert runs(reload_log) == ["1", "2", "1"]  # #2 reloaded, then #1 again
    saved = host.load_state()
    assert (saved.active_number, saved.in_progress) == (1, None)
    assert saved.managed_files == ["nginx.conf"]


def test_a_service_healthy_at_a_later_attempt_succeeds(host):
    flag = host.tmp_path / "warm"
    command = script(host.tmp_path, "warming.sh",
                     f"if [ -e {shlex.quote(str(flag))} ]; then echo warm; exit 0; fi\n"
                     f"touch {shlex.quote(str(flag))}; echo cold; exit 1\n")
    waits = []
    applier, state = host.applier(probe=Probe(command=command, interval_s=0.5),
                                  sleep=waits.append), host.load_state()

    outcome = applier.apply(make_bundle(1, V1), state)

    assert (outcome.status, outcome.health) == (SUCCEEDED, {
        "ok": True, "attempts": 2, "output": "warm", "probe": "command"})
    assert waits == [0.5]


@pytest.mark.slow
def test_a_probe_that_hangs_is_killed_at_its_timeout_with_its_children(host):
    marker = host.tmp_path / "survived"
    command = f"(sleep 3; touch {shlex.quote(str(marker))}) & sleep 30"
    applier, state = applied_v1(host)
    applier.probe = Probe(command=command, timeout_s=0.3, attempts=2, interval_s=0)

    started = time.monotonic()
    outcome = applier.apply(make_bundle(2, V2), state)

    assert time.monotonic() - started < 5
    assert outcome.status == WARNING
    assert outcome.health == {"ok": False, "attempts": 2, "output": "probe timed out after 0.3s",
                              "probe": "command"}
    assert text_tree(host.target) == V1
    time.sleep(3.5)
    assert not marker.exists()  # its process group was killed


def test_the_probe_runs_like_the_other_commands(host, tmp_path):
    seen = tmp_path / "seen"
    command = script(tmp_path, "env.sh",
                     f'{{ pwd; echo "$BELLWETHER_SNAPSHOT"; echo "${{SECRET_TOKEN:-unset}}"; }}'
                     f" > {shlex.quote(str(seen))}\n")
    environ = {**os.environ, "SECRET_TOKEN": "s3cret"}
    applier, state = host.applier(environ=environ, probe=Probe(command=command)), \
        host.load_state()

    assert applier.apply(make_bundle(7, V1), state).status == SUCCEEDED

    cwd, number, secret = seen.read_text().split()
    assert cwd == str(host.state_dir / "run")  # never the target directory
    assert (number, secret) == ("7", "unset")  # the scrubbed environment


def test_only_the_end_of_a_long_output_is_kept(host):
    command = "python3 -c \"print('x' * 10000 + 'END')\"; exit 1"
    applier, state = applied_v1(host)
    applier.probe = Probe(command=command, attempts=1)

    outcome = applier.apply(make_bundle(2, V2), state)

    output = outcome.health["output"]
    assert len(output) == OUTPUT_KEPT and output.endswith("xxxEND")
    assert len(outcome.message) < 4000


def test_no_probe_runs_when_validation_already_failed(host):
    command, log = unhealthy_on_v2(host.tmp_path)
    validate = script(host.tmp_path, "v.sh", 'grep -q "worker_processes 4" "$T/nginx.conf" '
                                             "&& exit 1\nexit 0\n")
    applier, state = applied_v1(host, validate=validate, probe=Probe(command=command))

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING and outcome.health is None
    assert runs(log) == ["1"]


def test_an_unhealthy_first_snapshot_with_nothing_to_restore_fails(host):
    command = script(host.tmp_path, "down.sh", "echo down; exit 1\n")
    applier, state = host.applier(probe=Probe(command=command, attempts=1)), host.load_state()

    outcome = applier.apply(make_bundle(1, V1), state)

    assert outcome.status == FAILED
    assert "health command failed after 1 attempt(s): exited 1: down" in outcome.message
    assert outcome.health["ok"] is False
    assert text_tree(host.target) == {}  # the unhealthy files did not stay


# --- the URL probe ----------------------------------------------------------------------


class HealthEndpoint:
    """A local HTTP server answering GET with the scripted (status, body, headers)
    in turn, the last one for ever after."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.requests = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                endpoint.requests.append(self.path)
                status, body, headers = (endpoint.answers.pop(0) if len(endpoint.answers) > 1
                                         else endpoint.answers[0])
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = ports.serve_in_thread(Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/healthz"

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint():
    started = []

    def start(*answers):
        started.append(HealthEndpoint(*answers))
        return started[-1]

    yield start
    for running in started:
        running.stop()


def test_a_url_answering_500_then_200_is_healthy_at_the_second_attempt(host, endpoint):
    service = endpoint((500, b"warming up", {}), (200, b"ok\n", {}))
    waits = []
    applier, state = host.applier(probe=Probe(url=service.url, interval_s=1),
                                  sleep=waits.append), host.load_state()

    outcome = applier.apply(make_bundle(1, V1), state)

    assert outcome.status == SUCCEEDED
    assert outcome.health == {"ok": True, "attempts": 2, "output": "HTTP 200: ok",
                              "probe": "url"}
    assert service.requests == ["/healthz", "/healthz"] and waits == [1]


def test_a_url_answering_500_every_time_restores_the_previous_files(host, endpoint):
    service = endpoint((503, b"db down", {}))
    reload, reload_log = counting(host.tmp_path, "reload")
    applier, state = applied_v1(host, reload=reload)
    applier.probe = Probe(url=service.url, attempts=2, interval_s=0)

    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING
    assert outcome.health == {"ok": False, "attempts": 2, "output": "HTTP 503: db down",
                              "probe": "url"}
    assert "(health url failed after 2 attempt(s): HTTP 503: db down); restored #1" \
        in outcome.message
    assert text_tree(host.target) == V1
    assert runs(reload_log) == ["1", "2", "1"]


def test_a_redirect_is_not_followed_and_is_not_healthy(endpoint):
    elsewhere = endpoint((200, b"fine", {}))
    service = endpoint((302, b"", {"Location": elsewhere.url}))

    assert url_check(service.url, 2) == (False, "HTTP 302", False)
    assert elsewhere.requests == []


def test_a_url_nothing_answers_is_unhealthy_with_the_reason():
    url = f"http://127.0.0.1:{ports.free_port()}/healthz"

    ok, output, cut = url_check(url, 2)

    assert not ok and not cut
    assert output.startswith(f"GET {url}: ") and "refused" in output.lower()


def test_a_large_body_is_read_only_in_part(endpoint):
    service = endpoint((500, b"y" * 1_000_000, {}))

    ok, output, cut = url_check(service.url, 2)

    assert not ok and cut and output.startswith("HTTP 500: ")
    assert len(output) <= BODY_READ + 10  # cut to OUTPUT_KEPT once redacted (check())


def test_with_command_and_url_the_url_is_asked_only_once_the_command_passed(host, endpoint):
    service = endpoint((200, b"ok", {}))
    command = script(host.tmp_path, "down.sh", "echo down; exit 1\n")
    applier, state = host.applier(probe=Probe(command=command, url=service.url, attempts=2)), \
        host.load_state()

    outcome = applier.apply(make_bundle(1, V1), state)

    assert outcome.health == {"ok": False, "attempts": 2, "output": "exited 1: down",
                              "probe": "command"}
    assert service.requests == []


# --- the report -------------------------------------------------------------------------


def test_the_report_carries_the_probe_and_the_snapshot_is_blocked(host, server):
    command, _ = unhealthy_on_v2(host.tmp_path)
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url, probe=Probe(command=command, attempts=2))
    assert agent.run_once() == EXIT_OK
    bad = server.publish(make_bundle(2, V2))

    assert agent.run_once() == EXIT_APPLY_FAILED

    first, second = server.reports
    assert first["health"] == {"ok": True, "attempts": 1, "output": "healthy",
                               "probe": "command"}
    assert second["status"] == WARNING
    assert second["health"]["ok"] is False and second["health"]["attempts"] == 2
    assert host.load_state().blocked == {"number": 2, "checksum": bad["checksum"]}
    assert text_tree(host.target) == V1


def test_without_a_probe_reports_carry_no_health(host, server):
    server.publish(make_bundle(1, V1))

    assert host.agent(server.url).run_once() == EXIT_OK

    assert "health" not in server.reports[0]


# --- configuration ----------------------------------------------------------------------

REQUIRED = ["--server", "https://bw.example", "--target-dir", "/srv/conf"]


def test_the_health_options_have_defaults_and_come_from_the_config_file(tmp_path):
    path = tmp_path / "agent.ini"
    path.write_text("[agent]\nhealth_command = /usr/local/bin/check\n"
                    "health_url = http://127.0.0.1:8080/healthz\nhealth_retries = 5\n")

    assert (lambda c: (c.health_command, c.health_url, c.health_timeout, c.health_retries,
                       c.health_interval))(load(REQUIRED, {})) == (None, None, 10.0, 3, 2.0)
    config = load(["--config", str(path), *REQUIRED, "--health-interval", "0"],
                  {"BELLWETHER_HEALTH_TIMEOUT": "4.5"})
    assert (config.health_command, config.health_url, config.health_timeout,
            config.health_retries, config.health_interval) == (
        "/usr/local/bin/check", "http://127.0.0.1:8080/healthz", 4.5, 5, 0.0)


@pytest.mark.parametrize(("args", "named"), [
    (["--health-url", "ftp://example.com/"], "--health-url"),
    (["--health-url", "127.0.0.1:8080/healthz"], "--health-url"),
    (["--health-url", "http:///healthz"], "--health-url"),
    (["--health-url", "http://[::1/healthz"], "--health-url"),
    (["--health-url", "http://host/a b"], "--health-url"),
    (["--health-timeout", "0"], "--health-timeout"),
    (["--health-timeout", "inf"], "--health-timeout"),
    (["--health-timeout", "soon"], "--health-timeout"),
    (["--health-interval", "-1"], "--health-interval"),
    (["--health-interval", "nan"], "--health-interval"),
    (["--health-retries", "0"], "--health-retries"),
    (["--health-retries", "2.5"], "--health-retries"),
    (["--health-retries", "101"], "--health-retries"),
    (["--health-retries", "many"], "--health-retries"),
])
def test_a_bad_health_option_is_a_configuration_error_naming_it(args, named):
    with pytest.raises(ConfigError) as raised:
        load([*REQUIRED, *args], {})

    assert str(raised.value).startswith(named)


def test_a_bad_health_option_exits_2_from_the_command_line(tmp_path):
    result = python_m_agent("--server", "https://bw.example", "--target-dir",
                            str(tmp_path / "t"), "--health-retries", "0")

    assert result.returncode == EXIT_CONFIG
    assert result.stderr.strip() == ("python -m agent: --health-retries must be a whole "
                                     "number of attempts from 1 to 100, not '0'")


def test_a_bad_health_url_from_the_environment_exits_2(tmp_path):
    result = python_m_agent("--server", "https://bw.example", "--target-dir",
                            str(tmp_path / "t"), BELLWETHER_HEALTH_URL="localhost/healthz")

    assert result.returncode == EXIT_CONFIG
    assert "--health-url 'localhost/healthz' is not a URL" in result.stderr


def test_a_probe_reports_the_end_of_a_large_body_at_most(endpoint):
    service = endpoint((500, b"y" * 1_000_000, {}))

    result = check(Probe(url=service.url, attempts=1), None, lambda seconds: None)

    assert not result.ok and len(result.output) <= OUTPUT_KEPT


def test_a_url_with_credentials_is_shown_without_them():
    assert shown("http://monitor:hunter2@10.0.0.1:8080/health?token=abc") == \
        "http://10.0.0.1:8080/health?…"
    assert shown("https://[::1]/h") == "https://[::1]/h"
    url = f"http://monitor:hunter2@127.0.0.1:{ports.free_port()}/healthz?token=abc"

    ok, output, _ = url_check(url, 2)

    assert not ok and "hunter2" not in output and "token=abc" not in output


# --- what a probe's output may carry: never a resolved secret ----------------------------


SECRET = "correct-horse-battery-staple"


@pytest.mark.parametrize("body", [
    b"x" * 4080 + f'"password": "{SECRET}"'.encode(),  # the read stops inside the secret
    f'{{"password": "{SECRET}"}}'.encode(),
])
def test_a_health_answer_holding_a_secret_is_redacted_even_when_cut(host, endpoint, body):
    service = endpoint((503, body, {}))
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SHOP_DB": SECRET}
    applier = host.applier(probe=Probe(url=service.url, attempts=1), environ=environ)

    outcome = applier.apply(make_bundle(1, {"app.conf": f"db={sealed('env:SHOP_DB')}\n"}),
                            host.load_state())

    for reported in (outcome.message, outcome.health["output"]):
        assert not any(SECRET[:n] in reported for n in range(4, len(SECRET) + 1)), reported
        assert "[secret]" in reported


@pytest.mark.parametrize("printed", [b"bad \xff byte", b"\x80\x81\xfe", b"caf\xe9"])
def test_output_that_is_not_utf8_fails_the_apply_with_a_report_and_restores(
        host, printed):
    (host.tmp_path / "printed").write_bytes(printed)
    state = host.load_state()
    assert host.applier().apply(make_bundle(1, V1), state).status == SUCCEEDED

    outcome = host.applier(validate=f"cat {host.tmp_path / 'printed'}; exit 1").apply(
        make_bundle(2, V2), state)

    assert outcome.status in (WARNING, FAILED)
    assert "validate exited 1: " in outcome.message and "\ufffd" in outcome.message
    assert text_tree(host.target) == V1
    assert host.load_state().in_progress is None


def test_an_unexpected_error_mid_apply_restores_the_previous_files(host, monkeypatch):
    state = host.load_state()
    applier = host.applier()
    assert applier.apply(make_bundle(1, V1), state).status == SUCCEEDED

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the agent")

    monkeypatch.setattr(applier, "_activate", broken)
    outcome = applier.apply(make_bundle(2, V2), state)

    assert outcome.status == WARNING
    assert "RuntimeError: a bug in the agent" in outcome.message
    assert text_tree(host.target) == V1
    assert host.load_state().in_progress is None
