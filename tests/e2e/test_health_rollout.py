"""End to end: a canary whose service turns unhealthy after the reload rolls a
staged rollout back by itself.

Three real `python -m agent` processes are in sync on #1, each probing its
service after every reload with --health-command. #2 is rolled out with one
canary and an automatic gate. #2 validates and reloads cleanly on the canary, but
its health probe fails (the "service" answers 503 with #2's workers = 8): the agent
puts #1's files back, reloads them and reports the failure with the probe's
output. That report alone makes the server roll the rollout back: #1's content
comes back as #3, and no agent outside the canary wave ever gets #2.
"""

from __future__ import annotations

import shlex

import pytest

from apps.releases.services import environment_update
from tests.e2e.harness import wait_for, wait_in_sync
from tests.e2e.test_rollout import (
    SETTINGS,
    TEMPLATES,
    active_number,
    config,
    deployer_api,
    deployments,
    wait_rolled_back,
)

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CANARY, OTHERS = "canary-1", ("web-1", "web-2")
UNHEALTHY_OUTPUT = "GET /healthz: 503 Service Unavailable (workers = 8 exhausts the pool)"


def health_command() -> str:
    """Unhealthy while #2's content (workers = 8) is in place; healthy otherwise."""
    return (f'if grep -q "workers = 8" "$BELLWETHER_TARGET_DIR/{SETTINGS}"; then '
            f"echo {shlex.quote(UNHEALTHY_OUTPUT)} >&2; exit 1; fi; echo healthy")


def health_args(fleet, name: str) -> list[str]:
    """The agent's health options and a reload command logging each reloaded number."""
    reloads = fleet.root / f"{name}-reloads.log"
    return ["--health-command", health_command(), "--health-retries", "2",
            "--health-interval", "0.2", "--health-timeout", "5",
            "--reload-command", f'echo "$BELLWETHER_SNAPSHOT" >> {shlex.quote(str(reloads))}']


def reloaded(fleet, name: str) -> list[str]:
    path = fleet.root / f"{name}-reloads.log"
    return path.read_text().split() if path.exists() else []


def test_a_canary_failing_its_health_probe_rolls_the_rollout_back(make_fleet, tenant,
                                                                   superuser):
    fleet = make_fleet(config("hello v1", workers=2), TEMPLATES)
    api = deployer_api(fleet, tenant, superuser)
    assert fleet.api.publish()["number"] == 1
    for name in (CANARY, *OTHERS):
        fleet.start_agent(name, *health_args(fleet, name))
    agents = wait_in_sync(fleet, [CANARY, *OTHERS], 1)
    ids = {name: agent["id"] for name, agent in agents.items()}
    first_files = fleet.api.snapshot_files(1)
    for name in (CANARY, *OTHERS):
        assert agents[name]["status"]["last_health"] == {
            "ok": True, "attempts": 1, "output": "healthy", "probe": "command"}

    # From now on publishing moves nobody: #2 is ready but not active.
    environment_update(environment=fleet.environment, release_policy="staged",
                       actor=fleet.actor)
    fleet.change_config(config("hello v2", workers=8))
    assert fleet.api.publish()["number"] == 2
    assert active_number(fleet) == 1
    created = api.call("POST", f"{api.env_path}/rollouts", {
        "snapshot": 2, "canary_agents": [ids[CANARY]],
        "waves": [{"percent": 100, "gate": "auto"}], "failure_threshold": 0,
    }, expect=201)
    assert {t["name"]: t["wave"] for t in created["targets"]} == {
        CANARY: 0, OTHERS[0]: 1, OTHERS[1]: 1}

    # Nobody confirms or rolls back: the canary's report does.
    rollout = wait_rolled_back(fleet, api, created["id"])

    assert (rollout["state"], rollout["current_wave"], rollout["rollback_snapshot"]) == (
        "rolled_back", 0, 3), rollout
    assert rollout["reason"].startswith(f"more than 0 target(s) failed; {CANARY}: #2 "), rollout
    assert [(f["agent"], f["status"]) for f in rollout["failures"]] == [
        (CANARY, "warning")], rollout
    assert rollout["reason"].endswith(rollout["failures"][0]["message"]), rollout
    assert rollout["final_evidence"]["failed"] == [CANARY], rollout

    # The canary applied #2, found it unhealthy twice, put #1 back and reloaded it,
    # and said so with the probe's output.
    [unhealthy] = [d for d in fleet.api.agent_deployments(ids[CANARY]) if d["snapshot"] == 2]
    assert (unhealthy["kind"], unhealthy["state"]) == ("pull", "warning"), unhealthy
    assert unhealthy["health"] == {"ok": False, "attempts": 2, "probe": "command",
                                   "output": f"exited 1: {UNHEALTHY_OUTPUT}"}, unhealthy
    assert "health command failed after 2 attempt(s)" in unhealthy["message"]
    assert unhealthy["message"].endswith("restored #1"), unhealthy

    # Every agent ends on #3 (#1's content), healthy; #2 reached the canary alone.
    agents = wait_in_sync(fleet, [CANARY, *OTHERS], 3)
    for name in (CANARY, *OTHERS):
        assert fleet.agents[name].files() == first_files
        assert agents[name]["status"]["last_health"]["ok"] is True
    wait_for(lambda: (reloaded(fleet, CANARY) == ["1", "2", "1", "3"],
                      reloaded(fleet, CANARY)),
             what="the canary's reloads: #1, #2, #1 restored, #3", diagnostics=fleet.logs)
    assert deployments(fleet, ids[CANARY]) == [
        (1, "pull", "succeeded"), (2, "pull", "warning"), (3, "pull", "succeeded")]
    for name in OTHERS:
        assert deployments(fleet, ids[name]) == [(1, "pull", "succeeded"),
                                                 (3, "pull", "succeeded")]
        assert "applying #2" not in fleet.agents[name].log()
        assert reloaded(fleet, name) == ["1", "3"]
    assert "health command failed after 2 attempt(s)" in fleet.agents[CANARY].log()
    for name in (CANARY, *OTHERS):
        assert fleet.agents[name].running(), fleet.agents[name].dump()
