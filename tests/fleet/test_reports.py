"""POST /api/v1/agent/reports: pulled applies get a row, pushes are closed, duplicates
change nothing, a late report overwrites superseded."""

import uuid

import pytest

from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from apps.releases.publishing import publication_abandon
from apps.releases.services import snapshot_publish
from tests.api_helpers import assert_error
from tests.factories import poll, publish_variant
from tests.fleet.support import REPORTS, agent_url, report


def _snapshot_of_agent(agent: Agent) -> dict:
    return {field: getattr(agent, field) for field in (
        "applied_number", "applied_checksum", "last_status", "last_message", "last_report_at",
        "blocked_number", "blocked_checksum", "generation")}


@pytest.fixture
def pushed(enroll, first, superuser):
    """pushed() -> a manual agent with a pending push of #1, and that deployment."""

    def make():
        agent = enroll(mode="manual")
        [deployment] = releases.snapshot_deploy(snapshot=first, agent_ids=[agent.agent.pk],
                                                actor=superuser)
        return agent, deployment

    return make


# -- pulls --------------------------------------------------------------------------------


def test_pull_report_creates_a_deployment_and_sets_applied(enroll, first, client_for):
    agent = enroll()

    response = report(agent.client, first, message="applied")

    assert response.status_code == 201
    body = response.json()
    assert (body["state"], body["duplicate"]) == ("succeeded", False)
    deployment = Deployment.objects.get(pk=body["deployment_id"])
    assert (deployment.kind, deployment.state, deployment.snapshot_id, deployment.agent_id) == (
        "pull", "succeeded", first.pk, agent.agent.pk)
    assert deployment.reported_checksum == first.checksum
    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]
    assert status["applied"] == {"number": 1, "checksum": first.checksum}
    assert (status["sync"], status["last_status"], status["last_message"]) == (
        "in_sync", "succeeded", "applied")
    assert status["last_report_at"] is not None


def test_duplicate_pull_report_changes_nothing(enroll, first):
    agent = enroll()
    created = report(agent.client, first, message="ok").json()
    before = (Deployment.objects.count(), _snapshot_of_agent(agent.fresh()))

    response = report(agent.client, first, message="ok")

    assert response.status_code == 200
    assert response.json() == {**created, "duplicate": True}
    assert (Deployment.objects.count(), _snapshot_of_agent(agent.fresh())) == before


def test_pull_report_with_another_result_is_recorded(enroll, first):
    agent = enroll()
    report(agent.client, first, status="failed", message="reload failed")

    response = report(agent.client, first, status="succeeded", message="")

    assert response.status_code == 201
    assert Deployment.objects.filter(agent=agent.agent).count() == 2


def test_failed_report_records_the_blocked_version(enroll, first, client_for):
    agent = enroll()

    response = report(agent.client, first, status="failed", message="validate failed")

    assert response.status_code == 201
    fresh = agent.fresh()
    assert (fresh.blocked_number, fresh.blocked_checksum) == (1, first.checksum)
    assert fresh.applied_number is None
    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]
    assert status["blocked"] == {"number": 1, "checksum": first.checksum}
    assert (status["last_status"], status["last_message"]) == ("failed", "validate failed")


def test_warning_report_keeps_the_previous_applied_snapshot(enroll, first, environment,
                                                           superuser):
    agent = enroll()
    report(agent.client, first)
    second = publish_variant(environment, superuser, workers=8)

    response = report(agent.client, second, status="warning", message="restored backup")

    assert response.status_code == 201
    fresh = agent.fresh()
    assert (fresh.applied_number, fresh.applied_checksum) == (1, first.checksum)
    assert (fresh.blocked_number, fresh.last_status) == (2, "warning")


def test_success_of_the_blocked_version_clears_the_block(enroll, first):
    agent = enroll()
    report(agent.client, first, status="failed", message="x")

    report(agent.client, first, status="succeeded")

    fresh = agent.fresh()
    assert (fresh.blocked_number, fresh.blocked_checksum) == (None, "")
    assert fresh.applied_number == 1


def test_a_late_report_of_an_older_snapshot_is_history_only(enroll, first, environment,
                                                            superuser, client_for):
    agent = enroll()
    second = publish_variant(environment, superuser, workers=8)
    report(agent.client, second, message="on #2")
    before = _snapshot_of_agent(agent.fresh())

    response = report(agent.client, first, status="failed", message="late failure of #1")

    assert response.status_code == 201
    assert Deployment.objects.filter(agent=agent.agent, snapshot=first, state="failed",
                                     message="late failure of #1").exists()
    assert _snapshot_of_agent(agent.fresh()) == before
    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]
    assert (status["sync"], status["last_status"], status["last_message"], status["blocked"]) == (
        "in_sync", "succeeded", "on #2", None)


def test_a_replay_of_an_earlier_report_not_the_latest_is_a_duplicate(enroll, first):
    agent = enroll()
    earlier = report(agent.client, first, status="failed", message="reload failed").json()
    report(agent.client, first, status="succeeded", message="")
    before = (Deployment.objects.count(), _snapshot_of_agent(agent.fresh()))

    response = report(agent.client, first, status="failed", message="reload failed")

    assert response.status_code == 200
    assert response.json() == {**earlier, "duplicate": True}
    assert (Deployment.objects.count(), _snapshot_of_agent(agent.fresh())) == before


def test_a_replay_of_an_older_snapshots_report_is_a_duplicate(enroll, first, environment,
                                                              superuser):
    agent = enroll()
    report(agent.client, first, message="on #1")
    second = publish_variant(environment, superuser, workers=8)
    report(agent.client, second, status="failed", message="bad")
    before = (Deployment.objects.count(), _snapshot_of_agent(agent.fresh()))

    response = report(agent.client, first, message="on #1")

    assert (response.status_code, response.json()["duplicate"]) == (200, True)
    assert (Deployment.objects.count(), _snapshot_of_agent(agent.fresh())) == before


# -- pushes -------------------------------------------------------------------------------


@pytest.mark.parametrize("status", ["succeeded", "warning", "failed"])
def test_push_report_closes_the_announced_deployment(status, pushed, first,
                                                     django_capture_on_commit_callbacks):
    agent, deployment = pushed()
    announced = poll(agent.client)
    assert announced.json()["deployment_id"] == str(deployment.pk)

    with django_capture_on_commit_callbacks(execute=True):
        response = report(agent.client, first, status=status, message="done",
                          deployment_id=deployment.pk)
    after = poll(agent.client, announced["ETag"])

    assert response.status_code == 201
    assert response.json() == {"deployment_id": str(deployment.pk), "state": status,
                               "duplicate": False}
    deployment.refresh_from_db()
    assert (deployment.state, deployment.message, deployment.reported_checksum) == (
        status, "done", first.checksum)
    assert deployment.reported_at is not None
    assert Deployment.objects.count() == 1
    assert after.status_code == 200
    assert after.json()["deployment_id"] is None
    assert after.json()["snapshot"]["number"] == 1


def test_identical_push_report_again_is_a_duplicate(pushed, first):
    agent, deployment = pushed()
    report(agent.client, first, message="ok", deployment_id=deployment.pk)
    deployment.refresh_from_db()
    before = (deployment.reported_at, Deployment.objects.count(),
              _snapshot_of_agent(agent.fresh()))

    response = report(agent.client, first, message="ok", deployment_id=deployment.pk)

    assert response.status_code == 200
    assert response.json()["duplicate"] is True
    deployment.refresh_from_db()
    assert (deployment.reported_at, Deployment.objects.count(),
            _snapshot_of_agent(agent.fresh())) == before


@pytest.mark.parametrize("status,message", [("failed", "ok"), ("succeeded", "other")],
                         ids=["other-status", "other-message"])
def test_push_report_with_a_different_payload_is_409(status, message, pushed, first):
    agent, deployment = pushed()
    report(agent.client, first, message="ok", deployment_id=deployment.pk)

    response = report(agent.client, first, status=status, message=message,
                      deployment_id=deployment.pk)

    assert_error(response, 409, "report_conflict")
    deployment.refresh_from_db()
    assert (deployment.state, deployment.message) == ("succeeded", "ok")


def test_unknown_deployment_id_is_404(enroll, first):
    agent = enroll()

    response = report(agent.client, first, deployment_id=uuid.uuid4())

    assert_error(response, 404, "not_found")
    assert not Deployment.objects.exists()


def test_another_agents_deployment_id_is_404(pushed, enroll, first):
    _, deployment = pushed()
    other = enroll("web-2")

    response = report(other.client, first, deployment_id=deployment.pk)

    assert_error(response, 404, "not_found")
    deployment.refresh_from_db()
    assert deployment.state == "pending"


def test_push_report_naming_another_snapshot_is_409(pushed, environment, superuser):
    agent, deployment = pushed()
    second = publish_variant(environment, superuser, workers=8)

    response = report(agent.client, second, deployment_id=deployment.pk)

    assert_error(response, 409)
    deployment.refresh_from_db()
    assert deployment.state == "pending"


def test_late_report_overwrites_superseded_with_the_real_result(pushed, first, environment,
                                                                superuser):
    agent, older = pushed()
    second = publish_variant(environment, superuser, workers=8)
    releases.snapshot_deploy(snapshot=second, agent_ids=[agent.agent.pk], actor=superuser)
    older.refresh_from_db()
    assert older.state == "superseded"

    response = report(agent.client, first, status="failed", message="late",
                      deployment_id=older.pk)

    assert response.status_code == 201
    older.refresh_from_db()
    assert (older.state, older.message) == ("failed", "late")


# -- refusals -----------------------------------------------------------------------------


def test_wrong_checksum_is_400(enroll, first):
    agent = enroll()

    response = report(agent.client, first, checksum="sha256:" + "0" * 64)

    assert_error(response, 400, "checksum_mismatch")
    assert not Deployment.objects.exists()
    assert agent.fresh().applied_number is None


def test_unknown_snapshot_number_is_400(enroll, first):
    agent = enroll()

    response = agent.client.post(REPORTS, {"snapshot": 7, "checksum": first.checksum,
                                           "status": "succeeded"}, format="json")

    assert_error(response, 400)
    assert not Deployment.objects.exists()


def test_invalid_snapshot_number_is_400(enroll, first, environment, superuser):
    agent = enroll()
    publication = snapshot_publish(environment=environment, actor=superuser)
    invalid = publication_abandon(publication_id=str(publication.pk), reason="test").snapshot

    response = report(agent.client, invalid, checksum=first.checksum)

    assert_error(response, 400)
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("change", [
    {"status": "done"},
    {"status": "superseded"},
    {"status": "pending"},
    {"snapshot": 0},
    {"snapshot": "one"},
    {"checksum": None},
    {"deployment_id": "not-a-uuid"},
    {"message": "x" * 4001},
], ids=lambda change: "-".join(f"{k}={str(v)[:10]}" for k, v in change.items()))
def test_bad_report_field_is_400(change, enroll, first):
    agent = enroll()
    body = {"deployment_id": None, "snapshot": 1, "checksum": first.checksum,
            "status": "succeeded", "message": ""}

    response = agent.client.post(REPORTS, {**body, **change}, format="json")

    assert_error(response, 400)
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("missing", ["snapshot", "checksum", "status"])
def test_missing_report_field_is_400(missing, enroll, first):
    agent = enroll()
    body = {"snapshot": 1, "checksum": first.checksum, "status": "succeeded"}
    del body[missing]

    assert_error(agent.client.post(REPORTS, body, format="json"), 400)


def test_report_needs_an_agent_token(first, api_client, superuser):
    body = {"snapshot": 1, "checksum": first.checksum, "status": "succeeded"}

    assert_error(api_client().post(REPORTS, body, format="json"), 401)
    assert_error(api_client(superuser).post(REPORTS, body, format="json"), 401)
    assert not Deployment.objects.exists()


def test_report_for_another_environments_snapshot_number_is_400(enroll, first, blog):
    blog_agent = enroll("web-1", env=blog)

    response = report(blog_agent.client, first)

    assert_error(response, 400)
    assert not Deployment.objects.exists()


def test_a_reports_message_cannot_start_a_log_line_of_its_own(enroll, first, caplog):
    agent = enroll()
    poll(agent.client)
    forged = "oops\n2026-12-03 13:11:00,000 CRITICAL django.security admin password reset"
    caplog.set_level("INFO", logger="apps.fleet.services")

    assert report(agent.client, first, "failed", message=forged).status_code == 201

    [line] = [r.getMessage() for r in caplog.records if "reported #1" in r.getMessage()]
    assert "\n" not in line and "oops\\n2026" in line
