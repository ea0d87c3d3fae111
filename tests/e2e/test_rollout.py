"""End to end: staged rollouts over real `python -m agent` processes that roll back
by themselves.

Three agents are in sync on #1 in an environment that requires activation; #2 is
published (not active) and rolled out with two canaries, one of which rejects #2 in
its validate command. Its report ("warning": #1 restored) makes the server's
reconcile roll the rollout back on its own: #1's content comes back as #3, the
canaries follow it, the agent outside the canary wave never sees #2, and #2 is
quarantined: its content published again (#4) is refused everywhere and reaches
no agent, while a new release (#5) reaches every agent.

The canaries' validate commands can be held on a gate file the test creates, so
the test decides when each report reaches the server.
"""

from __future__ import annotations

import contextlib
import re
import shlex
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from apps.environments.models import Environment
from apps.releases.services import environment_update
from apps.tenancy.models import Role
from tests import factories
from tests.e2e.harness import Api, shared_database_url, wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TEMPLATES = {"app/settings.conf": "message = {{ message }}\nworkers = {{ workers }}\n"}
SETTINGS = "app/settings.conf"
GOOD, BAD, REST = "canary-good", "canary-bad", "rest-1"
ROLLBACK_WAIT_S = 30.0
GATE_WAIT_TENTHS = 200  # a gated validate gives up waiting after 20 s


def config(message: str, workers: int) -> str:
    return f"message: {message}\nworkers: {workers}\n"


def validate_command(*, reject: bool, gate: Path | None = None) -> str:
    """A validate command for #2's content only (workers = 8): optionally wait until
    `gate` exists, then reject it (exit 1) or accept it. #1's and #3's content pass
    at once."""
    wait = ""
    if gate is not None:
        wait = (f"i=0; while [ ! -e {shlex.quote(str(gate))} ] && "
                f"[ $i -lt {GATE_WAIT_TENTHS} ]; do sleep 0.1; i=$((i+1)); done; ")
    verdict = ('echo "validate: workers = 8 is not allowed here" >&2; exit 1' if reject
               else "exit 0")
    return (f'if grep -q "workers = 8" "$BELLWETHER_TARGET_DIR/{SETTINGS}"; then '
            f"{wait}{verdict}; fi")


def deployer_api(fleet, tenant, superuser) -> Api:
    """A REST client for the fleet's environment with a deployer's API token."""
    deployer = factories.member(tenant, Role.DEPLOYER, username="deployer-prod",
                                actor=superuser)
    _, secret = factories.api_token(deployer, name="e2e-rollout")
    env = fleet.environment
    return Api(fleet.server, secret, env.application.name, env.name)


def deployments(fleet, agent_id: int) -> list[tuple]:
    return sorted((d["snapshot"], d["kind"], d["state"])
                  for d in fleet.api.agent_deployments(agent_id))


def snapshot_numbers(api: Api) -> list[int]:
    return sorted(s["number"] for s in api.call("GET", f"{api.env_path}/snapshots")["results"])


def active_number(fleet) -> int | None:
    active = Environment.objects.select_related("active_snapshot").get(
        pk=fleet.environment.pk).active_snapshot
    return None if active is None else active.number


def roll_out_second_snapshot(fleet, api: Api, *, good_validate: str,
                             bad_validate: str) -> tuple[dict, dict[str, int]]:
    """Three agents in sync on #1; require activation; publish #2 (not active) and
    roll it out with GOOD and BAD as canaries and REST in the next wave. Returns the
    created rollout and the agents' ids."""
    first = fleet.api.publish()
    assert first["number"] == 1  # activated: the environment does not require it yet
    fleet.start_agent(GOOD, "--validate-command", good_validate)
    fleet.start_agent(BAD, "--validate-command", bad_validate)
    fleet.start_agent(REST)
    agents = wait_in_sync(fleet, [GOOD, BAD, REST], 1)
    ids = {name: agents[name]["id"] for name in (GOOD, BAD, REST)}
    first_files = fleet.api.snapshot_files(1)
    assert first_files == {SETTINGS: "message = hello v1\nworkers = 2\n"}
    for name in (GOOD, BAD, REST):
        assert fleet.agents[name].files() == first_files

    # From now on publishing moves nobody: #2 is ready but not active.
    environment_update(environment=fleet.environment, release_policy="staged",
                       actor=fleet.actor)
    fleet.change_config(config("hello v2", workers=8))
    second = fleet.api.publish()
    assert second["number"] == 2
    assert fleet.api.snapshot_files(2) == {SETTINGS: "message = hello v2\nworkers = 8\n"}
    assert active_number(fleet) == 1
    assert {n: a["status"]["desired"]["number"] for n, a in fleet.api.agents().items()} == {
        GOOD: 1, BAD: 1, REST: 1}

    created = api.call("POST", f"{api.env_path}/rollouts", {
        "snapshot": 2,
        "canary_agents": [ids[GOOD], ids[BAD]],
        "waves": [{"percent": 100, "gate": "auto"}],
        "failure_threshold": 0,
    }, expect=201)
    assert (created["snapshot"], created["state"], created["current_wave"]) == (
        2, "running", 0)
    assert [w["size"] for w in created["waves"]] == [2, 1]
    assert {t["name"]: (t["wave"], t["state"]) for t in created["targets"]} == {
        GOOD: (0, "activated"), BAD: (0, "activated"), REST: (1, "pending")}
    return created, ids


def wait_rolled_back(fleet, api: Api, rollout_id: int) -> dict:
    def rolled_back():
        body = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
        return body["state"] == "rolled_back", {
            k: body.get(k) for k in ("state", "version", "reason", "rollback_snapshot",
                                     "current_wave_evidence")}

    wait_for(rolled_back, what=f"rollout {rollout_id} to roll back by itself",
             timeout=ROLLBACK_WAIT_S, diagnostics=fleet.logs)
    return api.call("GET", f"/api/v1/rollouts/{rollout_id}")


def test_a_canary_failing_validation_rolls_the_rollout_back_by_itself(
        make_fleet, tenant, superuser):
    fleet = make_fleet(config("hello v1", workers=2), TEMPLATES)
    api = deployer_api(fleet, tenant, superuser)
    gate = fleet.root / "let-canary-bad-fail"
    created, ids = roll_out_second_snapshot(
        fleet, api, good_validate=validate_command(reject=False),
        bad_validate=validate_command(reject=True, gate=gate))
    rollout_id = created["id"]
    first_files, second_files = fleet.api.snapshot_files(1), fleet.api.snapshot_files(2)

    # The good canary applies #2 and acknowledges it; that alone advances nothing.
    def good_acknowledged():
        body = api.call("GET", f"/api/v1/rollouts/{rollout_id}")
        evidence = body.get("current_wave_evidence") or {}
        return body["state"] == "running" and evidence.get("acknowledged") == [GOOD], body

    running = wait_for(good_acknowledged, what=f"{GOOD} to acknowledge #2",
                       diagnostics=fleet.logs)
    assert running["current_wave"] == 0
    assert running["current_wave_evidence"]["waiting"] == [BAD]
    assert running["current_wave_evidence"]["failed"] == []
    assert fleet.agents[GOOD].files() == second_files

    # Let the bad canary's validate reject #2. No confirm, no rollback from here:
    # its report makes the server's reconcile roll back.
    gate.touch()
    rollout = wait_rolled_back(fleet, api, rollout_id)

    assert rollout["state"] == "rolled_back", rollout
    assert rollout["snapshot"] == 2
    assert rollout["rollback_snapshot"] == 3, rollout
    assert rollout["finished_at"] is not None
    assert rollout["reason"].startswith("more than 0 target(s) failed; "), rollout
    [failure] = rollout["failures"]
    # (warning: the agent restored the old files)
    assert failure["status"] == "warning" and "validate exited" in failure["message"], rollout
    assert rollout["reason"].endswith(f"{failure['agent']}: {failure['message']}"), rollout
    assert rollout["current_wave"] == 0  # never advanced past the canaries
    # The reconcile queued by the report (the per-rollout task; the periodic sweep is
    # rollouts_reconcile_task) rolled back, inline in the server.
    assert "rolled_back" in reconcile_outcomes(fleet), fleet.server.dump()
    # Every pin the rollout held was released: canaries and the pending target alike
    # follow #3, nobody is stranded.
    assert {t["name"]: (t["wave"], t["state"]) for t in rollout["targets"]} == {
        GOOD: (0, "released"), BAD: (0, "released"), REST: (1, "released")}

    # #3: #1's content re-rendered as a new, higher snapshot, now the active one.
    third = api.call("GET", f"{api.env_path}/snapshots/3")
    assert (third["state"], third["rolled_back_from"]) == ("ready", 1), third
    assert third["checksum"] == fleet.api.call("GET", f"{api.env_path}/snapshots/1")[
        "checksum"]
    third_files = {f["path"]: f["content"] for f in third["files"]}
    assert third_files == first_files
    assert active_number(fleet) == 3
    assert snapshot_numbers(api) == [1, 2, 3]

    # Every agent ends on #3, the one outside the canary wave too.
    agents = wait_in_sync(fleet, [GOOD, BAD, REST], 3)
    for name in (GOOD, BAD, REST):
        status = agents[name]["status"]
        assert status["desired"] == {"number": 3, "checksum": third["checksum"]}, status
        assert status["pinned"] is None, status
        assert fleet.agents[name].files() == third_files == first_files
        assert fleet.agents[name].state()["active_number"] == 3

    # The failing canary rejected #2, restored #1 and reported a warning.
    [rejected] = [d for d in fleet.api.agent_deployments(ids[BAD]) if d["snapshot"] == 2]
    assert (rejected["kind"], rejected["state"]) == ("pull", "warning"), rejected
    assert "restored #1" in rejected["message"], rejected
    assert "workers = 8 is not allowed here" in rejected["message"], rejected
    assert deployments(fleet, ids[BAD]) == [
        (1, "pull", "succeeded"), (2, "pull", "warning"), (3, "pull", "succeeded")]
    assert "#2 warning" in fleet.agents[BAD].log()
    assert deployments(fleet, ids[GOOD]) == [
        (1, "pull", "succeeded"), (2, "pull", "succeeded"), (3, "pull", "succeeded")]

    # The agent outside the canary wave was never given #2; released, it took #3.
    assert deployments(fleet, ids[REST]) == [(1, "pull", "succeeded"), (3, "pull", "succeeded")]
    assert "applying #2" not in fleet.agents[REST].log()

    # #2 is quarantined: rolling it out again needs an explicit override.
    refused = api.call("POST", f"{api.env_path}/rollouts", {
        "snapshot": 2, "canary_agents": [ids[GOOD]],
        "waves": [{"percent": 100, "gate": "auto"}],
    }, expect=409)
    assert refused["error"]["code"] == "quarantined", refused

    # #2's content published again (an unrelated input change that renders the
    # same): the new snapshot is quarantined too, and nobody receives it.
    fleet.change_config(config("hello v2", workers=8))
    fourth = fleet.api.publish()
    assert fourth["number"] == 4
    fourth = api.call("GET", f"{api.env_path}/snapshots/4")
    assert fourth["checksum"] == fleet.api.call("GET", f"{api.env_path}/snapshots/2")[
        "checksum"]
    assert fourth["quarantined"], fourth
    for method, path, body in (
            ("POST", f"{api.env_path}/snapshots/4/activate", {}),
            ("POST", f"{api.env_path}/snapshots/4/deploy", {"agents": [ids[REST]]}),
            ("POST", f"{api.env_path}/rollouts", {
                "snapshot": 4, "canary_agents": [ids[GOOD]],
                "waves": [{"percent": 100, "gate": "auto"}]})):
        refused = api.call(method, path, body, expect=409)
        assert refused["error"]["code"] == "quarantined", (path, refused)
    assert active_number(fleet) == 3

    # A new release reaches every agent, the one that rejected #2 included.
    fleet.change_config(config("hello v3", workers=4))
    fifth = fleet.api.publish()
    assert fifth["number"] == 5
    assert api.call("POST", f"{api.env_path}/snapshots/5/activate", {}) == {"active": 5}
    agents = wait_in_sync(fleet, [GOOD, BAD, REST], 5)
    fifth_files = fleet.api.snapshot_files(5)
    assert fifth_files == {SETTINGS: "message = hello v3\nworkers = 4\n"}
    for name in (GOOD, BAD, REST):
        assert agents[name]["status"]["applied"]["number"] == 5
        assert fleet.agents[name].files() == fifth_files
        assert "applying #4" not in fleet.agents[name].log()
        assert 4 not in {d[0] for d in deployments(fleet, ids[name])}

    for name in (GOOD, BAD, REST):
        assert fleet.agents[name].running(), fleet.agents[name].dump()


# --- two reports at once ------------------------------------------------------------


@contextlib.contextmanager
def environment_row_locked(environment_id: int):
    """Hold the environment's row lock (every rollout transition takes it first) on a
    connection of our own, so reconciles queued by reports line up behind it."""
    table = Environment._meta.db_table
    with psycopg.connect(shared_database_url()) as held:
        held.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE", [environment_id])
        try:
            yield
        finally:
            held.rollback()


def lock_waiters() -> int:
    """Backends of the test database waiting to lock an environment row (the query
    text is cut at track_activity_query_size: match its start only)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = "
                       "current_database() AND wait_event_type = 'Lock' AND query LIKE %s",
                       [f'SELECT "{Environment._meta.db_table}".%'])
        return cursor.fetchone()[0]


def reconcile_outcomes(fleet) -> list[str]:
    """What each reconcile queued by a report returned, from the server's log."""
    return re.findall(r"rollout_reconcile_task\[[^\]]+\] succeeded in [^:]+: '([^']*)'",
                      fleet.server.log())


def test_two_reports_arriving_together_roll_back_once(make_fleet, tenant, superuser):
    fleet = make_fleet(config("hello v1", workers=2), TEMPLATES)
    api = deployer_api(fleet, tenant, superuser)
    gate = fleet.root / "let-canaries-validate"
    created, _ = roll_out_second_snapshot(
        fleet, api, good_validate=validate_command(reject=False, gate=gate),
        bad_validate=validate_command(reject=True, gate=gate))

    # Both canaries report #2 (one success, one warning) while a reconcile is busy:
    # the reconcile each report queues waits for the environment lock.
    with environment_row_locked(fleet.environment.pk):
        gate.touch()
        wait_for(lambda: (lock_waiters() >= 2, lock_waiters()),
                 what="the reconciles of both reports to wait for the lock",
                 diagnostics=fleet.logs)

    rollout = wait_rolled_back(fleet, api, created["id"])
    # Both reconciles finish (the one that loses must change nothing).
    outcomes = wait_for(lambda: (len(reconcile_outcomes(fleet)) >= 2,
                                 reconcile_outcomes(fleet)),
                        what="both reconciles to finish", diagnostics=fleet.logs)

    # Exactly one rollback: one new snapshot, the one the rollout records, active.
    assert rollout["rollback_snapshot"] == 3, rollout
    assert outcomes.count("rolled_back") == 1, outcomes
    assert active_number(fleet) == rollout["rollback_snapshot"]
    assert snapshot_numbers(api) == [1, 2, 3]
    wait_in_sync(fleet, [GOOD, BAD], 3)
