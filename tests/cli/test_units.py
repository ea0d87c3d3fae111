"""The CLI's pure parts, no server: configuration and its precedence, the
rollout request, wave progress and outcomes, following a rollout through
failures, and output that never lets the server's text drive the terminal."""

from __future__ import annotations

import argparse
import io

import pytest
from rich.console import Console

from cli import commands
from cli.config import profile_load, token_hint
from cli.errors import Refused, RolledBack, TimedOut, Unreachable, UsageError
from cli.main import build_parser, wave_spec
from cli.progress import awaits_confirm, follow, outcome_error, wave_rows
from cli.render import Output, detail_line, rollout_view, shown
from cli.rollouts import start_request

TOKEN = "bwu_abcdef123456.s3cr3t-value"


def load(tmp_path, text: str | None = None, **options):
    environ = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    environ.update(options.pop("environ", {}))
    if text is not None:
        (tmp_path / "bellwether").mkdir(exist_ok=True)
        (tmp_path / "bellwether" / "config.toml").write_text(text)
    return profile_load(config_option=options.get("config"), profile_option=options.get(
        "profile"), url_option=options.get("url"), environ=environ)


def test_the_environment_wins_over_the_profile_and_the_flag_over_both(tmp_path):
    config = f'[profiles.default]\nurl = "http://file:1"\ntoken = "{TOKEN}"\n'
    assert load(tmp_path, config).url == "http://file:1"
    from_env = load(tmp_path, config, environ={"BELLWETHER_URL": "http://env:2",
                                               "BELLWETHER_TOKEN": "bwu_x.y"})
    assert (from_env.url, from_env.token, from_env.token_source) == (
        "http://env:2", "bwu_x.y", "BELLWETHER_TOKEN")
    assert load(tmp_path, config, url="http://flag:3/").url == "http://flag:3"


def test_a_named_profile_with_a_token_file(tmp_path):
    (tmp_path / "prod.token").write_text(TOKEN + "\n")
    config = (f'default_profile = "prod"\n[profiles.prod]\nurl = "https://bw.example"\n'
              f'token_file = "{tmp_path / "prod.token"}"\ntimeout_s = 5\n'
              '[profiles.dev]\nurl = "http://127.0.0.1:8000"\ntoken = "bwu_dev.x"\n')
    profile = load(tmp_path, config)
    assert (profile.name, profile.token, profile.timeout_s) == ("prod", TOKEN, 5.0)
    assert load(tmp_path, config, profile="dev").token == "bwu_dev.x"
    assert TOKEN not in repr(profile) and "s3cr3t" not in token_hint(TOKEN)
    assert token_hint(TOKEN) == "bwu_abcdef123456.…"


@pytest.mark.parametrize("config, says", [
    ("[profiles.default\n", "is not valid TOML"),
    ('[profiles.default]\nurl = "http://x"\ntokn = "a"\n', r"unknown key\(s\) tokn"),
    ('[profiles.default]\nurl = "ftp://x"\ntoken = "a"\n', "is not a server URL"),
    ('[profiles.default]\nurl = "http://x"\ntoken = "a b"\n', "spaces or control"),
    ('[profiles.default]\nurl = "http://x"\n', "no token"),
    ('[profiles.default]\nurl = "http://x"\ntoken = "a"\ntimeout_s = 0\n', "timeout_s"),
])
def test_bad_configuration_is_a_usage_error_naming_the_problem(tmp_path, config, says):
    with pytest.raises(UsageError, match=says) as raised:
        load(tmp_path, config)
    assert "a b" not in raised.value.message  # a token is never echoed


def test_an_unknown_profile_or_a_missing_named_config_file_is_refused(tmp_path):
    with pytest.raises(UsageError, match="has no profile 'prod'"):
        load(tmp_path, '[profiles.default]\nurl = "http://x"\n', profile="prod")
    with pytest.raises(UsageError, match="does not exist"):
        load(tmp_path, config=str(tmp_path / "absent.toml"))


def test_the_rollout_request_carries_only_what_was_given_and_the_strategy():
    args = build_parser().parse_args(["rollout", "start", "shop/prod", "--strategy", "canary",
                                      "--canary-agents", "4,web-5", "--canary-agents", "6",
                                      "--canary-label", "az=eu-1a", "--wave", "25%",
                                      "--wave", "3:manual:60"])
    assert start_request(args, 7) == {
        "snapshot": 7, "strategy": "canary", "canary_agents": [4, "web-5", 6],
        "canary_labels": {"az": "eu-1a"},
        "waves": [{"percent": 25}, {"count": 3, "gate": "manual", "bake_s": 60}]}
    bare = build_parser().parse_args(["rollout", "start", "shop/prod"])
    assert start_request(bare, 2) == {"snapshot": 2}
    confirmed = build_parser().parse_args(["rollout", "start", "shop/prod", "--confirm"])
    assert start_request(confirmed, 2) == {"snapshot": 2, "confirm": True}


class _Releases:
    """A server holding one release, recording what the CLI posts."""

    release = {"id": 42, "environment": "shop/prod", "snapshot": 7, "state": "open",
               "checksum": "sha256:" + "ab" * 32, "plan_digest": "cd" * 32,
               "plan": {"kind": "activate"}}

    def __init__(self):
        self.posts = []

    def get(self, path, **params):
        return dict(self.release)

    def post(self, path, body):
        self.posts.append((path, body))
        return {**self.release, "state": "open"}


def test_approve_without_the_content_reviewed_shows_it_and_approves_nothing():
    server, out = _Releases(), io.StringIO()
    args = build_parser().parse_args(["approve", "42"])

    with pytest.raises(UsageError) as raised:
        commands.approve(server, args, Output("text", stdout=out))

    assert server.posts == []
    assert _Releases.release["plan_digest"] in out.getvalue()
    assert f"--checksum {_Releases.release['checksum']}" in raised.value.message
    assert raised.value.exit_code == 2


def test_approve_names_the_content_given_not_what_the_server_holds_now():
    server = _Releases()
    args = build_parser().parse_args(["approve", "42", "--checksum", "sha256:seen",
                                      "--plan-digest", "digest-seen", "--comment", "CHG-7"])

    assert commands.approve(server, args, Output("text", stdout=io.StringIO())) == 0
    assert server.posts == [("/api/v1/releases/42/approve", {
        "checksum": "sha256:seen", "plan_digest": "digest-seen", "comment": "CHG-7"})]


@pytest.mark.parametrize("bad", ["25", "x%", "25%:maybe", "%", "25%:auto:-1", ""])
def test_a_wave_spec_is_percent_or_count_then_gate_and_bake(bad):
    if bad == "25":
        assert wave_spec(bad) == {"count": 25}
        return
    with pytest.raises(argparse.ArgumentTypeError):
        wave_spec(bad)


RUNNING = {"id": 7, "environment": "shop/prod", "snapshot": 2, "state": "running",
           "current_wave": 1, "reason": "", "rollback_snapshot": None,
           "waves": [{"index": 0, "size": 2, "gate": "manual", "targets": 2, "activated": 2},
                     {"index": 1, "size": 5, "gate": "auto", "targets": 5, "activated": 5},
                     {"index": 2, "size": 3, "gate": "auto", "targets": 3, "activated": 0}],
           "current_wave_evidence": {"acknowledged": ["a", "b"], "failed": ["c"],
                                     "waiting": ["d", "e"]}}


def test_wave_rows_of_a_running_rollout():
    rows = [(r.label, r.activated, r.acknowledged, r.failed) for r in wave_rows(RUNNING)]
    assert rows == [("the canaries", 2, 2, 0), ("wave 1", 5, 2, 1), ("wave 2", 0, 0, 0)]


def test_a_running_waves_counts_are_the_servers_not_the_names_it_lists():
    five_thousand = {**RUNNING, "waves": [
        RUNNING["waves"][0], {**RUNNING["waves"][1], "targets": 5000, "activated": 5000,
                              "acknowledged": 4321, "failed": 3}, RUNNING["waves"][2]],
        "current_wave_evidence": {"acknowledged": [f"a{i}" for i in range(100)]}}
    assert wave_rows(five_thousand)[1].acknowledged == 4321
    assert wave_rows(five_thousand)[1].failed == 3


def test_follow_names_each_manual_gate_once_when_its_wave_is_acknowledged():
    complete = {"acknowledged": ["a"], "failed": [], "waiting": []}
    manual = [{"index": i, "gate": "manual", "targets": 1, "activated": 1} for i in range(3)]
    at = [{**RUNNING, "waves": manual, "current_wave": wave, "current_wave_evidence": complete}
          for wave in (0, 0, 1, 2)]
    script = Script([*at, {**at[-1], "state": "completed"}])

    follow(script, 7, display=script, timeout_s=60, interval_s=1, clock=lambda: script.now,
           sleep=script.sleep)

    assert script.notes == [
        f"{name}: acknowledged, waiting for a confirm: bellwether rollout confirm 7"
        for name in ("the canaries", "wave 1", "wave 2")]


def test_wave_rows_of_a_finished_rollout_are_the_counts_it_kept():
    finished = {**RUNNING, "state": "rolled_back", "reason": "more than 0 target(s) failed",
                "waves": [{"index": 0, "gate": "auto", "size": 2, "targets": 2,
                           "activated": 2, "acknowledged": 1, "failed": 1}]}
    assert [(r.acknowledged, r.failed) for r in wave_rows(finished)] == [(1, 1)]
    error = outcome_error(finished)
    assert isinstance(error, RolledBack) and "more than 0 target(s) failed" in error.message
    assert isinstance(outcome_error({**finished, "state": "paused"}), TimedOut)
    assert outcome_error({**finished, "state": "completed"}) is None


def test_a_manual_wave_with_complete_evidence_awaits_a_confirm():
    complete = {**RUNNING, "current_wave": 0,
                "current_wave_evidence": {"acknowledged": ["a", "b"], "failed": [],
                                          "waiting": []}}
    assert awaits_confirm(complete)
    assert not awaits_confirm(RUNNING)


class Script:
    """A client answering a scripted list (an exception is raised), and a clock."""

    def __init__(self, answers):
        self.answers, self.now, self.notes, self.shown = list(answers), 0.0, [], []

    def get(self, path):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def update(self, rollout):
        self.shown.append(rollout["state"])

    def note(self, text):
        self.notes.append(text)

    def sleep(self, seconds):
        self.now += seconds


def test_follow_rides_out_transient_failures_until_the_rollout_finishes():
    script = Script([Unreachable("no answer"), Refused(503, "unavailable", "db down"),
                     RUNNING, {**RUNNING, "state": "completed"}])
    done = follow(script, 7, display=script, timeout_s=60, interval_s=1,
                  clock=lambda: script.now, sleep=script.sleep)
    assert done["state"] == "completed"
    assert script.shown == ["running", "completed"] and len(script.notes) == 2


def test_follow_stops_on_a_refusal_and_times_out_on_a_rollout_that_runs_on():
    with pytest.raises(Refused):
        script = Script([Refused(404, "not_found", "Rollout not found.")])
        follow(script, 7, display=script, timeout_s=60, interval_s=1,
               clock=lambda: script.now, sleep=script.sleep)
    script = Script([RUNNING] * 10)
    with pytest.raises(TimedOut, match="did not finish within 3 s"):
        follow(script, 7, display=script, timeout_s=3, interval_s=1,
               clock=lambda: script.now, sleep=script.sleep)


def test_the_servers_text_is_never_markup_or_a_terminal_escape():
    hostile = "[bold red]x[/] \x1b[2J\x1b]0;title\x07 \u202eevil"
    text = shown(hostile)
    assert "\x1b" not in text.plain and "\u202e" not in text.plain
    assert text.plain.startswith("[bold red]x[/]")  # shown literally
    stream = io.StringIO()
    Console(file=stream, force_terminal=True, width=120).print(
        rollout_view({**RUNNING, "environment": hostile}))
    assert "\x1b[2J" not in stream.getvalue() and "━" in stream.getvalue()


def test_details_name_the_field_or_the_file_and_line():
    assert detail_line({"field": "waves[1].percent", "message": "too big"}) == \
        "waves[1].percent: too big"
    assert detail_line({"code": "template_syntax", "message": "unexpected '}'",
                        "file": "nginx/shop.conf", "line": 3}) == \
        "nginx/shop.conf:3: template_syntax: unexpected '}'"
    assert detail_line({"agent": "web-2", "holder": 7}) == '{"agent": "web-2", "holder": 7}'
