"""End to end: a hand-edited managed file on an agent's host is reported as drift,
shown by the API, and restored once the environment's drift policy is `restore`
(a real server process and a real `python -m agent`)."""

from __future__ import annotations

import shlex

import pytest

from apps.audit.models import AuditEvent
from tests.e2e.harness import wait_for, wait_in_sync

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TEMPLATES = {"app/settings.conf": "message = {{ message }}\nworkers = {{ workers }}\n"}
CONFIG = "message: hello\nworkers: 2\n"


def _drift(fleet, name: str):
    return fleet.api.agents()[name]["status"]["drift"]


def test_a_hand_edit_is_reported_as_drift_and_restored_under_the_restore_policy(
        make_fleet, tmp_path):
    fleet = make_fleet(CONFIG, TEMPLATES)
    fleet.api.publish()
    reloads = tmp_path / "reloads.log"
    agent = fleet.start_agent("web-1", "--reload-command",
                              f"echo reload >> {shlex.quote(str(reloads))}")
    agent_id = wait_in_sync(fleet, ["web-1"], 1)["web-1"]["id"]
    expected = fleet.api.snapshot_files(1)
    settings = agent.target_dir / "app" / "settings.conf"

    # A hand edit under the default policy: reported, left alone.
    settings.write_text("message = hello\nworkers = 64\ndebug = on\n")
    drift = wait_for(lambda: ((d := _drift(fleet, "web-1")) is not None, d),
                     what="the drift reported", diagnostics=fleet.logs)

    assert drift["files"] == [{"path": "app/settings.conf", "change": "modified",
                               "summary": "+2 -1 lines"}]
    assert drift["restored"] is False
    listed = fleet.api.call("GET", f"{fleet.api.env_path}/agents?drifted=1")["results"]
    assert [a["id"] for a in listed] == [agent_id]
    assert settings.read_text() == "message = hello\nworkers = 64\ndebug = on\n"
    assert AuditEvent.objects.filter(action="agent.drift", object_id=str(agent_id)).count() == 1

    # The owner switches to restore: the agent applies the snapshot's files again.
    before = reloads.read_text().count("reload")
    fleet.api.call("PATCH", fleet.api.env_path, {"drift_policy": "restore"})
    drift = wait_for(lambda: ((d := _drift(fleet, "web-1")) is not None and d["restored"], d),
                     what="the drift restored", diagnostics=fleet.logs)

    assert agent.files() == expected
    assert reloads.read_text().count("reload") == before + 1  # the normal apply path
    assert drift["files"][0]["path"] == "app/settings.conf"
    assert fleet.api.call("GET", f"{fleet.api.env_path}/agents?drifted=1")["results"] == []

    # A deleted file comes back too, and the agent keeps running and in sync.
    settings.unlink()
    wait_for(lambda: (settings.exists(), agent.files()), what="the deleted file restored",
             diagnostics=fleet.logs)
    assert agent.files() == expected
    assert agent.running()
    status = fleet.api.agents()["web-1"]["status"]
    assert (status["sync"], status["applied"]["number"]) == ("in_sync", 1)

    def drift_audit():  # the report goes out after the restored file is on disk
        restored = [e.data["restored"] for e in AuditEvent.objects.filter(
            action="agent.drift", object_id=str(agent_id)).order_by("id")]
        return len(restored) == 3, restored

    assert wait_for(drift_audit, what="the second restore audited",
                    diagnostics=fleet.logs) == [False, True, True]
