"""Every command against a live server holding the demo, as a subprocess and in
process: what it shows, its --output json, and its refusals (bad token, unknown
environment, bad descriptor, missing role, routes the server lacks, a server
that is down) with their exit codes."""

from __future__ import annotations

import json
import time

import pytest

from cli.errors import REFUSED, UNREACHABLE, USAGE
from tests.e2e.harness import free_port

pytestmark = pytest.mark.processes

GOOD_DESCRIPTOR = """\
apiVersion: bellwether/v1
application: shop
environment: staging
id: rel-cli-1
version: 2.4.0
params:
  release_channel: beta
"""
# Line 5 is not YAML.
BROKEN_YAML = "apiVersion: bellwether/v1\napplication: shop\nenvironment: staging\nid: x\n" \
              "params: [unclosed\n"
# A param the demo's policy does not let descriptors add.
FORBIDDEN_PARAM = GOOD_DESCRIPTOR.replace("release_channel", "workers").replace(
    "rel-cli-1", "rel-cli-2")


def error_of(result) -> dict:
    """The error document --output json prints on stdout."""
    return json.loads(result.stdout)["error"]


def test_environments_lists_what_the_token_sees(shared_live):
    result = shared_live.run("environments")
    assert result.returncode == 0, result.stderr
    assert "shop/prod" in result.stdout and "shop/staging" in result.stdout
    assert "staged" in result.stdout and "direct" in result.stdout

    listed = shared_live.json("environments")
    by_name = {e["full_name"]: e for e in listed}
    assert by_name["shop/prod"]["active_snapshot"]["number"] == 1
    assert by_name["shop/staging"]["active_snapshot"]["number"] == 2


def test_a_bad_token_is_refused_with_the_envelope_and_never_shown(shared_live):
    secret = "bwu_000000000000.not-a-real-secret-value"
    result = shared_live.run("environments", token=secret)
    assert result.returncode == REFUSED
    assert "401 authentication_failed" in result.stderr
    assert "not-a-real-secret-value" not in result.stdout + result.stderr

    result = shared_live.run("environments", "--output", "json", token=secret)
    assert result.returncode == REFUSED
    error = error_of(result)
    assert (error["status"], error["code"]) == (401, "authentication_failed")
    assert json.loads(result.stdout)["exit_code"] == REFUSED


def test_an_unknown_environment_is_a_404_for_every_command(shared_live):
    for args in (["preview", "shop/nope"], ["diff", "shop/nope", "1"],
                 ["agents", "shop/nope"], ["rollout", "start", "shop/nope", "--snapshot", "1"],
                 ["rollout", "status", "shop/nope"], ["publish", "shop/nope"]):
        result = shared_live.run(*args, "-o", "json")
        assert result.returncode == REFUSED, (args, result.stderr)
        assert (error_of(result)["status"], error_of(result)["code"]) == (404, "not_found"), args
        assert "404 not_found" in result.stderr, args


def test_preview_renders_the_current_inputs(shared_live):
    result = shared_live.run("preview", "shop/staging")
    assert result.returncode == 0, result.stderr
    assert "shop/staging: valid, checksum sha256:" in result.stdout
    assert "shop/config.json" in result.stdout

    body = shared_live.json("preview", "shop/staging")
    assert body["valid"] is True
    assert {f["path"] for f in body["files"]} == {"nginx/sites-enabled/shop.conf",
                                                  "shop/config.json"}


def test_diff_shows_what_a_snapshot_changes(shared_live):
    result = shared_live.run("diff", "shop/prod", "2")
    assert result.returncode == 0, result.stderr
    assert "shop/prod #2 against #1: 1 file(s) changed" in result.stdout
    assert '-  "workers": 4,' in result.stdout and '+  "workers": 8,' in result.stdout

    body = shared_live.json("diff", "shop/prod", "1", "--against", "2")
    assert (body["snapshot"], body["against"]) == (1, 2)
    assert [f["path"] for f in body["files"]] == ["shop/config.json"]

    missing = shared_live.run("diff", "shop/prod", "99", "-o", "json")
    assert missing.returncode == REFUSED
    assert error_of(missing)["code"] == "not_found"


def test_publish_a_descriptor_dry_run_then_for_real(shared_live, tmp_path):
    descriptor = tmp_path / "release.yaml"
    descriptor.write_text(GOOD_DESCRIPTOR)

    dry = shared_live.json("publish", "-f", str(descriptor), "--dry-run")
    assert dry["valid"] is True
    assert dry["effective_config"]["params"]["release_channel"] == "beta"

    published = shared_live.json("publish", "-f", str(descriptor))
    assert published["state"] == "ready"
    assert published["environment"] == "shop/staging"
    assert published["activated"] is True  # staging is direct
    number = published["snapshot"]["number"]
    assert number >= 3

    again = shared_live.run("publish", "-f", str(descriptor))  # same id: idempotent
    assert again.returncode == 0, again.stderr
    assert f"shop/staging #{number} " in again.stdout


def test_publish_an_environments_current_inputs(shared_live):
    result = shared_live.run("publish", "shop/prod")
    assert result.returncode == 0, result.stderr
    # prod is staged: identical content exists as #2, which waits for a rollout
    assert "shop/prod #2 " in result.stdout
    assert "not activated (staged): released by rollout or activation" in result.stdout


def test_a_descriptor_that_is_not_yaml_is_refused_naming_its_line(shared_live, tmp_path):
    descriptor = tmp_path / "broken.yaml"
    descriptor.write_text(BROKEN_YAML)
    result = shared_live.run("publish", "-f", str(descriptor), "-o", "json")
    assert result.returncode == REFUSED, result.stderr
    error = error_of(result)
    assert error["status"] == 400
    assert error["code"] == "parse_error"
    # The file, and the line where the parser gave up (the unclosed list's end).
    assert error["message"].startswith(f"{descriptor}: YAML body:6: "), error
    assert f"400 parse_error: {descriptor}: YAML body:6:" in result.stderr


def test_a_descriptor_adding_what_the_policy_forbids_names_the_field(shared_live, tmp_path):
    descriptor = tmp_path / "forbidden.yaml"
    descriptor.write_text(FORBIDDEN_PARAM)
    result = shared_live.run("publish", "-f", str(descriptor), "--dry-run", "-o", "json")
    assert result.returncode == REFUSED, (result.stdout, result.stderr)
    shown = result.stdout + result.stderr
    assert "workers" in shown, shown


def test_a_missing_descriptor_file_is_a_usage_error(shared_live, tmp_path):
    code, _, err = shared_live.call("publish", "-f", str(tmp_path / "absent.yaml"))
    assert code == USAGE
    assert "absent.yaml does not exist" in err
    code, _, err = shared_live.call("publish", "shop/prod", "-f", str(tmp_path / "x.yaml"))
    assert code == USAGE and "not both" in err


def test_a_viewer_may_look_but_not_publish(shared_live):
    assert shared_live.run("environments", token="viewer").returncode == 0
    result = shared_live.run("publish", "shop/staging", "-o", "json", token="viewer")
    assert result.returncode == REFUSED
    assert error_of(result)["status"] == 403


def test_agents_lists_the_environments_agents(shared_live):
    assert shared_live.json("agents", "shop/prod") == []
    result = shared_live.run("agents", "shop/prod", "--drift", "drifted")
    assert result.returncode == 0, result.stderr
    assert "shop/prod: 0 agent(s)" in result.stdout


def test_rollout_status_of_an_unknown_rollout_or_an_environment_without_one(shared_live):
    result = shared_live.run("rollout", "status", "99999", "-o", "json")
    assert result.returncode == REFUSED
    assert error_of(result)["code"] == "not_found"
    code, _, err = shared_live.call("rollout", "status", "shop/staging")
    assert code == REFUSED and "shop/staging has no rollout" in err


def test_confirm_and_rollback_of_an_unknown_rollout_are_404(shared_live):
    for action in ("confirm", "rollback"):
        result = shared_live.run("rollout", action, "99999", "-o", "json")
        assert result.returncode == REFUSED
        assert error_of(result)["code"] == "not_found"


def test_approving_an_unknown_release_is_the_servers_404(shared_live):
    result = shared_live.run("approve", "99999", "--comment", "CHG-7", "-o", "json")
    assert result.returncode == REFUSED, result.stderr
    assert (error_of(result)["status"], error_of(result)["code"]) == (404, "not_found")


def test_promote_publishes_on_the_target_what_the_source_runs(live):
    promoted = live.run("promote", "shop/staging", "shop/prod", "-o", "json")
    assert promoted.returncode == 0, promoted.stderr
    body = json.loads(promoted.stdout)
    # Staging runs no descriptor: on prod's own config that renders prod's #2 again.
    assert (body["state"], body["snapshot"]["number"], body["deduplicated"]) == (
        "ready", 2, True)

    stale = live.run("promote", "shop/staging", "shop/prod", "--snapshot", "1", "-o", "json")
    assert stale.returncode == REFUSED and error_of(stale)["code"] == "stale", stale.stdout
    across = live.run("promote", "shop/staging", "blog/prod", "-o", "json")
    assert across.returncode == REFUSED and error_of(across)["status"] == 404


def test_a_server_that_is_down_fails_fast_and_clearly(shared_live):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens
    started = time.monotonic()
    result = shared_live.run("environments", "-o", "json", BELLWETHER_URL=url)
    assert time.monotonic() - started < 15
    assert result.returncode == UNREACHABLE
    assert f"cannot reach {url}" in result.stderr
    assert json.loads(result.stdout)["error"]["kind"] == "unreachable"


@pytest.mark.parametrize("args, says", [
    (["preview", "shop"], "is not APPLICATION/ENVIRONMENT"),
    (["rollout", "start", "shop/prod", "--wave", "150x"], "is not a wave"),
    (["rollout", "start", "shop/prod", "--canary-label", "nolabel"], "is not KEY=VALUE"),
    (["diff", "shop/prod", "0"], "is not a whole number of at least 1"),
    (["rollout"], "required"),
    (["nonsense"], "invalid choice"),
])
def test_usage_errors_exit_2(shared_live, args, says, capsys):
    code, _, _ = shared_live.call(*args)
    assert code == USAGE
    assert says in capsys.readouterr().err


def test_no_token_or_no_server_is_a_usage_error_saying_where_to_put_it(shared_live):
    code, _, err = shared_live.call("environments", token=None)
    assert code == USAGE
    assert "no token: set BELLWETHER_TOKEN" in err and "api_token create" in err
    environ = {"BELLWETHER_URL": ""}
    code, _, err = shared_live.call("environments", **environ)
    assert code == USAGE and "no server: set BELLWETHER_URL" in err


def test_every_command_has_help_with_examples(shared_live, capsys):
    commands = [["environments"], ["preview"], ["diff"], ["publish"], ["agents"],
                ["promote"], ["approve"], ["config"], ["rollout"], ["rollout", "start"],
                ["rollout", "status"], ["rollout", "confirm"], ["rollout", "rollback"]]
    for command in commands:
        code, _, _ = shared_live.call(*command, "--help")
        help_text = capsys.readouterr().out
        assert code == 0, command
        assert "examples:" in help_text and "bellwether " in help_text, command
    code, _, _ = shared_live.call("--help")
    assert code == 0 and "Exit codes:" in capsys.readouterr().out
