"""The production shape (README "Production shape"), proven end to end.

Every process README lists, started as it documents them, on the pytest PostgreSQL
test database and a Redis of this test's own: two web nodes (granian serving
project.asgi, one worker each), `celery -A project worker`, `celery -A project beat`,
and four `python -m agent` processes, two enrolled through each node. Nothing runs
inline: the worker renders every publication and runs every reconcile, and beat's
`reconcile-rollouts` reaches it through the broker.

An operator's API token comes from `manage.py api_token create`; everything else
goes over HTTP. The `bellwether` command (`python -m cli`, what the script runs)
publishes and rolls out through node A with --wait, as docs/ci.md's CI job does;
the fleet is checked through node B. A staged rollout with an automatic gate
completes (exit 0) and every agent converges; a second one, whose canary refuses the
new content in its validate command, rolls back by itself (exit 4) and no other
agent ever receives it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from apps.tenancy.models import Role
from cli.errors import ROLLED_BACK
from tests import factories
from tests.e2e.harness import (
    PROJECT_ROOT,
    AgentProcess,
    Api,
    CeleryProcess,
    Server,
    free_port,
    wait_for,
    wait_in_sync,
)

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

SECRET_KEY = "e2e-production-shape-" + "0123456789abcdefghijklmnopqrstuvwxyz" * 2
SETTINGS = "app/settings.conf"
TEMPLATES = {SETTINGS: "message = {{ message }}\nworkers = {{ workers }}\n"}
CLI_TIMEOUT_S = 90
# B-1 refuses the content of the second rollout (8 workers); earlier content passes.
REFUSE_EIGHT_WORKERS = (f'if grep -q "workers = 8" "$BELLWETHER_TARGET_DIR/{SETTINGS}"; then '
                        'echo "validate: 8 workers is too many here" >&2; exit 1; fi')
AGENTS = {  # name: (node, agent options)
    "a-1": ("A", ("--labels", "canary=true")),
    "a-2": ("A", ()),
    "b-1": ("B", ("--validate-command", REFUSE_EIGHT_WORKERS)),
    "b-2": ("B", ()),
}


def config(message: str, workers: int) -> str:
    return f"message: {message}\nworkers: {workers}\n"


@pytest.fixture
def production_environ(server_environ, redis_server) -> dict:
    """Production settings: PostgreSQL with its connection pool, Redis, DEBUG off, a
    strong key, tasks through the broker (nothing inline)."""
    environ = {k: v for k, v in server_environ.items()
               if k not in ("DATABASE_POOL", "CELERY_TASK_ALWAYS_EAGER")}
    environ.update({"REDIS_URL": redis_server.url, "DEBUG": "0", "SECRET_KEY": SECRET_KEY,
                    "SECURE_COOKIES": "0"})
    return environ


@pytest.fixture
def shop_prod(application, tenant, superuser):
    """shop/prod (direct for now) and its operator, an owner (who may also deploy)."""
    environment = factories.environment(application, "prod", config=config("v1", 2),
                                        templates=TEMPLATES, poll_interval_s=5,
                                        actor=superuser)
    factories.member(tenant, Role.OWNER, username="ops", actor=superuser)
    return environment


@pytest.fixture
def production(shop_prod, processes, production_environ, tmp_path) -> SimpleNamespace:
    """Two web nodes, a worker and beat, all started at once, then an API token."""
    node_a, node_b = (Server.production(port=free_port(), env=production_environ,
                                        log_path=tmp_path / f"node-{n}.log") for n in "ab")
    node_a.label, node_b.label = f"node A :{node_a.port}", f"node B :{node_b.port}"
    worker = CeleryProcess.worker(env=production_environ, log_path=tmp_path / "worker.log")
    beat = CeleryProcess.beat(env=production_environ, log_path=tmp_path / "beat.log",
                              state_root=tmp_path / "state")
    for process in (node_a, node_b, worker, beat):
        processes.append(process)
        process.start()
    token = api_token_created(production_environ, "ops")
    for process in (node_a, node_b, worker, beat):
        process.wait_ready()
    return SimpleNamespace(a=node_a, b=node_b, worker=worker, beat=beat, token=token,
                           processes=processes)


def api_token_created(environ: dict, username: str) -> str:
    """`manage.py api_token create USERNAME --name ci` (docs/ci.md): the secret."""
    result = subprocess.run([sys.executable, "manage.py", "api_token", "create", username,
                             "--name", "ci"], cwd=PROJECT_ROOT, env=environ,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, (result.stdout, result.stderr)
    return result.stdout.strip()


def logs(production) -> str:
    return "\n".join(process.dump() for process in production.processes)


def bellwether(production, home: Path, *args: str) -> subprocess.CompletedProcess:
    """The `bellwether` command against node A, as a CI job runs it."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("BELLWETHER_")}
    environ.update({"HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                    "BELLWETHER_URL": production.a.url, "BELLWETHER_TOKEN": production.token,
                    "COLUMNS": "200"})
    return subprocess.run([sys.executable, "-m", "cli", *args, "--output", "json"],
                          cwd=PROJECT_ROOT, env=environ, capture_output=True, text=True,
                          timeout=CLI_TIMEOUT_S, stdin=subprocess.DEVNULL)


def published(production, home: Path) -> int:
    """`bellwether publish shop/prod`: waits while the worker renders; the number."""
    result = bellwether(production, home, "publish", "shop/prod")
    assert result.returncode == 0, (result.stdout, result.stderr, logs(production))
    body = json.loads(result.stdout)
    assert body["state"] == "ready", body
    return body["snapshot"]["number"]


def enrollment_token(api: Api) -> str:
    body = api.call("POST", f"{api.env_path}/enrollment-tokens",
                    {"uses": len(AGENTS), "expires_in_s": 600, "name": "e2e"}, expect=201)
    return body["token"]


def staged_with(api: Api, config_text: str) -> None:
    """The environment's config changed and its policy staged (at the version read)."""
    version = api.call("GET", api.env_path)["version"]
    api.call("PATCH", api.env_path, {"config": config_text, "release_policy": "staged",
                                     "expected_version": version})


def snapshot_numbers_deployed(api: Api, agent_id: int) -> set[int]:
    return {d["snapshot"] for d in api.agent_deployments(agent_id)}


def test_the_production_shape_rolls_out_through_the_cli_and_every_agent_converges(
        production, tmp_path):
    home = tmp_path / "ci-home"
    home.mkdir()
    via_a = Api(production.a, production.token, "shop", "prod")
    via_b = Api(production.b, production.token, "shop", "prod")
    fleet = SimpleNamespace(api=via_b, logs=lambda: logs(production))  # for wait_in_sync

    # Enrolled through both nodes, half each, with one enrollment token.
    secret = enrollment_token(via_b)
    nodes = {"A": production.a, "B": production.b}
    agents = {}
    for name, (node, options) in AGENTS.items():
        agents[name] = AgentProcess(name=name, server_url=nodes[node].url,
                                    root=tmp_path / "agents" / name, extra_args=options,
                                    enrollment_token=secret)
        production.processes.append(agents[name])
        agents[name].start()

    # #1, rendered by the worker, reaches every agent (the environment is direct).
    assert published(production, home) == 1
    wait_in_sync(fleet, list(AGENTS), 1, timeout=30)

    # #2 in a staged environment: stored, released to nobody until a rollout.
    staged_with(via_a, config("v2", 4))
    assert published(production, home) == 2
    desired = {n: a["status"]["desired"]["number"] for n, a in via_b.agents().items()}
    assert desired == dict.fromkeys(AGENTS, 1)

    # The CI job's rollout: the canary by label, an automatic gate once it acknowledged
    # and baked 3 s (opened by a reconcile on the worker), then everyone.
    result = bellwether(production, home, "rollout", "start", "shop/prod", "--snapshot", "2",
                        "--canary-label", "canary=true", "--canary-gate", "auto",
                        "--bake-s", "3", "--wave", "100%", "--failure-threshold", "0",
                        "--wait", "--timeout", "60", "--interval", "0.5")
    assert result.returncode == 0, (result.stdout, result.stderr, logs(production))
    rollout = json.loads(result.stdout)
    assert (rollout["state"], rollout["snapshot"]) == ("completed", 2), rollout
    assert [(w["targets"], w["acknowledged"]) for w in rollout["waves"]] == [(1, 1), (3, 3)]

    second = wait_in_sync(fleet, list(AGENTS), 2, timeout=30)
    second_files = via_b.snapshot_files(2)
    assert second_files == {SETTINGS: "message = v2\nworkers = 4\n"}
    for name, agent in agents.items():
        assert second[name]["status"]["desired"]["number"] == 2
        assert agent.files() == second_files, name

    # The worker rendered both; neither web node rendered anything.
    assert stored_by(production.worker) >= {1, 2}
    assert stored_by(production.a) == stored_by(production.b) == set()

    # A second rollout whose canary (on node B) refuses the content: rolled back by
    # itself, exit 4, and no other agent ever receives it.
    via_a.call("PATCH", via_a.env_path, {"config": config("v3", 8)})
    assert published(production, home) == 3
    ids = {name: agent["id"] for name, agent in second.items()}
    result = bellwether(production, home, "rollout", "start", "shop/prod", "--snapshot", "3",
                        "--canary-agents", str(ids["b-1"]), "--canary-gate", "auto",
                        "--wave", "100%", "--failure-threshold", "0", "--wait",
                        "--timeout", "60", "--interval", "0.5")
    assert result.returncode == ROLLED_BACK, (result.stdout, result.stderr, logs(production))
    outcome = json.loads(result.stdout)
    assert outcome["error"]["kind"] == "rolled_back", outcome
    assert (outcome["rollout"]["state"], outcome["rollout"]["rollback_snapshot"]) == (
        "rolled_back", 4), outcome
    assert "8 workers is too many here" in agents["b-1"].log()

    # #4 is #2's content again, and every agent converges on it.
    converged = wait_in_sync(fleet, list(AGENTS), 4, timeout=30)
    assert via_b.snapshot_files(4) == second_files
    for name, agent in agents.items():
        assert converged[name]["status"]["desired"]["number"] == 4
        assert agent.files() == second_files, name
        deployed = snapshot_numbers_deployed(via_b, ids[name])
        canary = name == "b-1"
        assert (3 in deployed) == canary, (name, sorted(deployed))
        assert ("applying #3 " in agent.log()) == canary, agent.dump()
    assert stored_by(production.worker) == {1, 2, 3, 4}  # the rollback's #4 too

    # Beat's periodic work reaches the worker through the broker (it sends
    # reconcile-rollouts every 15 s, so by now at least once).
    wait_for(lambda: (periodic_reconcile_ran(production), None),
             what="beat's reconcile-rollouts run by the worker", timeout=20,
             diagnostics=lambda: logs(production))


def stored_by(process) -> set[int]:
    """The shop/prod snapshots whose render `process` logged as stored."""
    return {int(n) for n in re.findall(r"shop/prod #(\d+) \([^)]*\) stored as ready",
                                       process.log())}


def periodic_reconcile_ran(production) -> bool:
    sent = "Sending due task reconcile-rollouts" in production.beat.log()
    return sent and re.search(r"rollouts_reconcile_task\[[0-9a-f-]+\] succeeded",
                              production.worker.log()) is not None
