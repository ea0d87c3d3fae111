"""The API of quarantine by content and of pending changes after a rollback:
flags on snapshots, overrides (owners, with a reason), lifting, resetting inputs."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.releases import services as releases
from tests.api.support import ENV
from tests.factories import enrolled_agents, publish, start_rollout
from tests.rollouts.support import rollback

pytestmark = pytest.mark.django_db

S = f"{ENV}/snapshots"


@pytest.fixture
def rolled_back(environment, superuser):
    """#1 active, #2 rolled out to a canary and rolled back (#3 active), then the
    unchanged inputs published again as #4: #2's content, quarantined."""
    publish(environment, superuser)
    releases.environment_update(environment=environment, release_policy="staged",
                                config=environment.config.replace("workers: 4", "workers: 8"),
                                actor=superuser)
    second = publish(environment, superuser)
    nodes = enrolled_agents(environment, 2)
    rollout = start_rollout(environment, second, nodes[:1])
    rollback(rollout, reason="canary failed")
    again = publish(environment, superuser)
    assert (again.number, again.checksum) == (4, second.checksum)
    return rollout, nodes


def test_snapshots_carry_active_and_quarantined(rolled_back, client_for):
    rollout, _ = rolled_back
    client = client_for("viewer")
    listed = {s["number"]: s for s in client.get(S).json()["results"]}
    assert [n for n, s in listed.items() if s["active"]] == [3]
    for number in (2, 4):
        assert listed[number]["quarantined"]["snapshot"] == 2
        assert listed[number]["quarantined"]["rollout"] == rollout.pk
        assert listed[number]["quarantined"]["reason"] == "canary failed"
    assert listed[1]["quarantined"] is None and listed[3]["quarantined"] is None
    detail = client.get(f"{S}/4").json()
    assert detail["active"] is False and detail["quarantined"]["snapshot"] == 2


def test_the_environment_carries_its_active_snapshot(rolled_back, client_for):
    body = client_for("viewer").get(ENV).json()
    assert body["active_snapshot"]["number"] == 3
    assert set(body["active_snapshot"]) == {"number", "label", "checksum"}


@pytest.mark.parametrize("path, body", [
    ("4/activate", {}),
    ("4/deploy", {"agents": []}),
])
def test_releasing_quarantined_content_is_409_naming_the_origin(rolled_back, client_for,
                                                                path, body):
    rollout, _ = rolled_back
    response = client_for("deployer").post(f"{S}/{path}", body, format="json")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "quarantined"
    assert "#2" in error["message"] and f"rollout {rollout.pk}" in error["message"]


def test_a_rollout_of_quarantined_content_is_refused_and_a_deployer_cannot_override(
        rolled_back, client_for):
    _, nodes = rolled_back
    body = {"snapshot": 4, "canary_agents": [nodes[0].pk]}
    client = client_for("deployer")
    assert client.post(f"{ENV}/rollouts", body, format="json").status_code == 409
    forced = client.post(f"{ENV}/rollouts", {**body, "override_quarantine": True,
                                             "reason": "trust me"}, format="json")
    assert forced.status_code == 403


def test_an_owner_overrides_with_a_reason_only(rolled_back, client_for):
    client = client_for("owner")
    bare = client.post(f"{S}/4/activate", {"override_quarantine": True}, format="json")
    assert (bare.status_code, bare.json()["error"]["code"]) == (400, "reason_required")
    done = client.post(f"{S}/4/activate", {"override_quarantine": True,
                                           "reason": "infra fixed"}, format="json")
    assert done.status_code == 200
    assert AuditEvent.objects.filter(action=Action.QUARANTINE_OVERRIDE).count() == 1


def test_an_owner_lifts_a_quarantine(rolled_back, client_for):
    assert client_for("deployer").post(f"{S}/4/quarantine/lift", {}).status_code == 403
    client = client_for("owner")
    lifted = client.post(f"{S}/4/quarantine/lift", {"reason": "fixed"}, format="json")
    assert lifted.status_code == 200 and lifted.json()["quarantined"] is None
    assert client.post(f"{S}/2/quarantine/lift", {}, format="json").status_code == 404
    assert client.post(f"{S}/4/activate", {}, format="json").status_code == 200


def test_pending_after_a_rollback_tells_the_truth_and_owners_reset(rolled_back, client_for,
                                                                 environment):
    rollout, _ = rolled_back
    pending = client_for("viewer").get(f"{ENV}/pending").json()
    assert pending["rolled_back"] == {"rollout": rollout.pk, "snapshot": 2}
    assert f"rolled back in rollout {rollout.pk}" in pending["message"]
    assert pending["against"]["number"] == 3 and pending["files"]

    assert client_for("deployer").post(f"{ENV}/reset-inputs").status_code == 403
    reset = client_for("owner").post(f"{ENV}/reset-inputs")
    assert reset.status_code == 200
    assert (reset.json()["rolled_back"], reset.json()["files"]) == (None, [])
    assert AuditEvent.objects.filter(action=Action.ENVIRONMENT_RESET).count() == 1
    environment.refresh_from_db()
    assert "workers: 4" in environment.config


def test_reset_inputs_without_an_active_snapshot_is_409(environment, client_for):
    response = client_for("owner").post(f"{ENV}/reset-inputs")
    assert (response.status_code, response.json()["error"]["code"]) == (
        409, "no_active_snapshot")
