"""End to end: decommissioning an agent stops the real agent process at its next
poll (exit 3, also while the server answers it 304 from its cache), and a new
agent enrolls under the same name while the old one's history stays."""

from __future__ import annotations

import pytest

from tests.e2e.harness import AgentProcess, wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TEMPLATES = {"app/settings.conf": "message = {{ message }}\n"}


def test_a_decommissioned_agent_stops_and_a_new_one_enrolls_under_its_name(make_fleet):
    fleet = make_fleet("message: hello\n", TEMPLATES)
    fleet.api.publish()
    old = fleet.start_agent("web-1")
    listed = wait_in_sync(fleet, ["web-1"], 1)["web-1"]

    gone = fleet.api.call("POST", f"/api/v1/agents/{listed['id']}/decommission",
                          {"expected_generation": listed["generation"]})

    assert gone["decommissioned_at"] is not None
    code = wait_for(lambda: (not old.running(), old.process.returncode),
                    what="the decommissioned agent to exit", diagnostics=fleet.logs)
    assert code == 3
    assert "decommissioned" in old.log()
    assert fleet.api.agents() == {}
    assert old.files() == {"app/settings.conf": "message = hello\n"}  # left as they were

    new = AgentProcess(name="web-1", server_url=fleet.server.url,
                       root=fleet.root / "web-1-again", extra_args=(),
                       enrollment_token=fleet.enrollment_token)
    fleet.processes.append(new)
    fleet.agents["web-1"] = new
    new.start()
    again = wait_in_sync(fleet, ["web-1"], 1)["web-1"]

    assert again["id"] != listed["id"]
    assert new.files() == {"app/settings.conf": "message = hello\n"}
    history = fleet.api.agent_deployments(listed["id"])
    assert [(d["snapshot"], d["state"]) for d in history] == [(1, "succeeded")]
    both = fleet.api.call("GET", f"{fleet.api.env_path}/agents?decommissioned=any")
    assert sorted((a["name"], a["decommissioned_at"] is None) for a in both["results"]) == [
        ("web-1", False), ("web-1", True)]
