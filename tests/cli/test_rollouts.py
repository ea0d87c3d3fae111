"""`bellwether rollout` against a live server with real `python -m agent`
processes on the demo's shop/prod (#1 active, #2 waiting for a rollout): --wait
exits 0 when the rollout completes, 4 when a canary's failure rolls it back, 3
when it times out waiting for a manual confirm; confirm, rollback and status
--watch, with plain lines off a terminal and progress bars on one."""

from __future__ import annotations

import json

import pytest

from cli.errors import REFUSED, ROLLED_BACK, TIMED_OUT

pytestmark = pytest.mark.processes

# The demo's #2 raises workers from 4 to 8 in shop/config.json: this canary's
# validate command refuses it (#1's content passes).
REFUSE_SECOND = ('if grep -q \'"workers": 8\' "$BELLWETHER_TARGET_DIR/shop/config.json"; '
                 'then echo "validate: 8 workers is too many here" >&2; exit 1; fi')


def two_agents_on_the_first_snapshot(live, *canary_args: str) -> dict[str, int]:
    live.start_agent("canary-1", *canary_args)
    live.start_agent("web-1")
    agents = live.wait_agents_at(["canary-1", "web-1"], 1)
    return {name: agent["id"] for name, agent in agents.items()}


def test_wait_exits_0_when_the_rollout_completes(live):
    ids = two_agents_on_the_first_snapshot(live)
    result = live.run("rollout", "start", "shop/prod", "--canary-agents", str(ids["canary-1"]),
                      "--canary-gate", "auto", "--wave", "100%", "--wait", "--timeout", "120",
                      "--interval", "0.5", "--output", "json")
    assert result.returncode == 0, (result.stdout, result.stderr, live.server.log()[-3000:])
    rollout = json.loads(result.stdout)
    assert (rollout["state"], rollout["snapshot"]) == ("completed", 2)  # the newest
    assert [(w["targets"], w["acknowledged"]) for w in rollout["waves"]] == [(1, 1), (1, 1)]
    # Progress went to stderr as plain lines (not a terminal), stdout is the document.
    assert "the canaries (auto): activated 1/1" in result.stderr

    agents = live.wait_agents_at(["canary-1", "web-1"], 2)
    assert {a["status"]["sync"] for a in agents.values()} == {"in_sync"}
    environments = {e["full_name"]: e for e in live.json("environments")}
    assert environments["shop/prod"]["active_snapshot"]["number"] == 2


def test_wait_exits_4_with_the_reason_when_a_canary_rolls_it_back(live):
    two_agents_on_the_first_snapshot(live, "--validate-command", REFUSE_SECOND)
    result = live.run("rollout", "start", "shop/prod", "--snapshot", "2", "--canary-agents",
                      "canary-1", "--canary-gate", "auto", "--wait",
                      "--timeout", "120", "--interval", "0.5")
    assert result.returncode == ROLLED_BACK, (result.stdout, result.stderr)
    assert "was rolled back: more than 0 target(s) failed; canary-1: #2 failed" in result.stderr
    assert ("\n  canary-1 warning: #2 failed (validate exited 1: validate: 8 workers is too "
            "many here); restored #1\n") in result.stderr
    assert "rolled back as #3" in result.stdout  # the last plain line of progress

    status = live.json("rollout", "status", "shop/prod")  # its latest rollout
    assert (status["state"], status["rollback_snapshot"]) == ("rolled_back", 3)
    watched = live.run("rollout", "status", str(status["id"]), "--watch", "-o", "json")
    assert watched.returncode == ROLLED_BACK
    assert json.loads(watched.stdout)["rollout"]["state"] == "rolled_back"
    assert json.loads(watched.stdout)["error"]["kind"] == "rolled_back"


def test_a_manual_gate_times_out_then_confirm_and_watch_complete_it(live):
    ids = two_agents_on_the_first_snapshot(live)
    result = live.run("rollout", "start", "shop/prod", "--canary-agents", str(ids["canary-1"]),
                      "--canary-gate", "manual", "--wait", "--timeout", "8",
                      "--interval", "0.5")
    assert result.returncode == TIMED_OUT, (result.stdout, result.stderr)
    assert "did not finish within 8 s" in result.stderr
    rollout_id = live.json("rollout", "status", "shop/prod")["id"]
    live.wait_agents_at(["canary-1"], 2)

    code, out, err = live.call("rollout", "confirm", str(rollout_id))
    assert code == 0, err
    assert f"rollout {rollout_id} of shop/prod #2:" in out

    # On a terminal: a progress bar per wave, redrawn until it completes.
    watched = live.run("rollout", "status", "shop/prod", "--watch", "--timeout", "120",
                       "--interval", "0.5", FORCE_COLOR="1", TTY_COMPATIBLE="1")
    assert watched.returncode == 0, (watched.stdout, watched.stderr)
    assert "━" in watched.stdout  # rich's bars
    assert f"rollout {rollout_id} completed: #2 is active" in watched.stdout


def test_rollback_ends_a_running_rollout_and_confirm_is_then_refused(live):
    ids = two_agents_on_the_first_snapshot(live)
    started = live.json("rollout", "start", "shop/prod", "--canary-agents",
                        str(ids["canary-1"]), "--wave", "100%:manual")
    assert (started["state"], started["current_wave"]) == ("running", 0)
    assert [w["gate"] for w in started["waves"]] == ["manual", "manual"]

    rolled = live.json("rollout", "rollback", str(started["id"]))
    assert (rolled["state"], rolled["rollback_snapshot"]) == ("rolled_back", 3)

    refused = live.run("rollout", "confirm", str(started["id"]), "--expected-version", "1",
                       "-o", "json")
    assert refused.returncode == REFUSED
    assert json.loads(refused.stdout)["error"]["status"] == 409
    assert "409 " in refused.stderr
