"""End to end: a deployer's descriptor cannot make a real agent resolve a secret; an
owner's template places one, and the agent writes it into a 0600 file.

A real server process, a real `python -m agent` with secrets in its environment and
on its disk, and descriptors submitted through the REST API with a deployer's token.
"""

from __future__ import annotations

import os
import time

import pytest

from apps.environments.services import policy_publish
from apps.tenancy.models import Role
from tests import factories
from tests.e2e.harness import AgentProcess, http_json, wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

POLICY = {"descriptor_policy": {"params": ["banner", "parts"], "secret_refs": ["env:SHOP_*"],
                                "rollback": True}}
CONFIG = "name: shop\nparams:\n  mode: prod\nsecrets:\n  db: env:SHOP_DB\n"
TEMPLATES = {
    "app/secret.conf": "db={{ secrets.db }}\n",
    "app/banner.conf": ("banner={{ params.banner | default('none') }}\n"
                        "parts={{ params.parts | default([]) | join('') }}\n"),
}
OWNER_SECRET = "owner-db-pass"
AWS_KEY = "aws-key-of-the-host"
HOST_FILE_SECRET = "root-only-host-file"


def descriptor(release: str, **params) -> dict:
    return {"apiVersion": "bellwether/v1", "application": "shop", "environment": "prod",
            "id": release, "version": release, "params": params}


def hostile_descriptors(host_file) -> list[dict]:
    return [
        descriptor("r1", banner=f"${{secret:file:{host_file}}}"),
        descriptor("r2", banner="${secret:env:AWS_SECRET_ACCESS_KEY}"),
        descriptor("r3", parts=["${secret:env:", "AWS_SECRET_ACCESS_KEY}"]),
        descriptor("r4", parts=["$", "{secret:file:", str(host_file), "}"]),
        descriptor("r5", banner="${secret:file:/dev/zero}"),
        descriptor("r6", banner="${secret:env:SHOP_DB}"),  # an allowed reference, still text
        {**descriptor("r7"), "secrets": {"aws": "env:AWS_SECRET_ACCESS_KEY"}},
    ]


def everything_written(agent) -> str:
    return "\n".join(agent.files().values()) + (agent.state_dir / "state.json").read_text()


def test_a_descriptor_never_resolves_a_secret_and_an_owners_secret_lands_0600(
        make_fleet, tenant, superuser, tmp_path):
    policy_publish(content=POLICY, actor=superuser)
    fleet = make_fleet(CONFIG, TEMPLATES)
    host_file = tmp_path / "host-secret"
    host_file.write_text(HOST_FILE_SECRET)
    assert fleet.api.publish()["number"] == 1
    agent = AgentProcess(name="web-1", server_url=fleet.server.url, root=fleet.root / "web-1",
                         extra_args=["--secret-allow", "env:SHOP_*"],
                         enrollment_token=fleet.enrollment_token)
    agent.env.update(SHOP_DB=OWNER_SECRET, AWS_SECRET_ACCESS_KEY=AWS_KEY)
    fleet.processes.append(agent)
    fleet.agents["web-1"] = agent
    agent.start()

    wait_in_sync(fleet, ["web-1"], 1)

    secret_file = agent.target_dir / "app/secret.conf"
    assert secret_file.read_text() == f"db={OWNER_SECRET}\n"
    assert os.stat(secret_file).st_mode & 0o777 == 0o600
    assert os.stat(agent.target_dir / "app/banner.conf").st_mode & 0o777 == 0o644
    assert OWNER_SECRET not in fleet.api.snapshot_files(1)["app/secret.conf"]

    deployer = factories.member(tenant, Role.DEPLOYER, username="deployer-e2e",
                                actor=superuser)
    _, token = factories.api_token(deployer, name="e2e")
    answers = []
    for body in hostile_descriptors(host_file):
        status, answer = http_json("POST", f"{fleet.server.url}/api/v1/descriptors", body,
                                   token=token)
        answers.append((status, answer))
        # Refused with the reason: the secret_reference naming file and line, or the
        # policy refusing the descriptor's own secret.
        expected = "merge_conflict" if "secrets" in body else "secret_reference"
        assert status == 400 and expected in str(answer), answer
    # Nothing the deployer sent became a snapshot an agent may apply.
    time.sleep(3)  # several poll cycles
    assert agent.state()["active_number"] == 1
    written = everything_written(agent)
    assert HOST_FILE_SECRET not in written and AWS_KEY not in written
    assert secret_file.read_text() == f"db={OWNER_SECRET}\n"

    # A harmless release by the same deployer applies, and the owner's secret is kept 0600.
    status, answer = http_json("POST", f"{fleet.server.url}/api/v1/descriptors",
                               descriptor("r-ok", banner="hello"), token=token)
    assert status in (200, 201, 202), answer
    number = fleet.api.call("GET", fleet.api.env_path)["active_snapshot"]
    number = number["number"] if isinstance(number, dict) else number
    wait_for(lambda: (agent.state()["active_number"] == number, agent.state()),
             what="the release applied")
    assert (agent.target_dir / "app/banner.conf").read_text().startswith("banner=hello\n")
    assert secret_file.read_text() == f"db={OWNER_SECRET}\n"
    assert os.stat(secret_file).st_mode & 0o777 == 0o600
    assert HOST_FILE_SECRET not in everything_written(agent)


def test_the_environments_declared_secret_file_mode_reaches_the_host_and_changes_alone(
        make_fleet, tmp_path):
    fleet = make_fleet(CONFIG + 'secret_file_mode: "0640"\n', TEMPLATES)
    assert fleet.api.publish()["number"] == 1
    agent = AgentProcess(name="web-1", server_url=fleet.server.url, root=fleet.root / "web-1",
                         enrollment_token=fleet.enrollment_token)
    agent.env.update(SHOP_DB=OWNER_SECRET)
    fleet.processes.append(agent)
    fleet.agents["web-1"] = agent
    agent.start()
    wait_in_sync(fleet, ["web-1"], 1)

    secret_file = agent.target_dir / "app/secret.conf"
    assert secret_file.read_text() == f"db={OWNER_SECRET}\n"
    assert os.stat(secret_file).st_mode & 0o777 == 0o640
    assert os.stat(agent.target_dir / "app/banner.conf").st_mode & 0o777 == 0o644

    # Only the mode changes: a new snapshot all the same, and the host follows it.
    fleet.change_config(CONFIG + 'secret_file_mode: "0440"\n')
    assert fleet.api.publish()["number"] == 2
    wait_in_sync(fleet, ["web-1"], 2)
    assert os.stat(secret_file).st_mode & 0o777 == 0o440
    assert secret_file.read_text() == f"db={OWNER_SECRET}\n"
