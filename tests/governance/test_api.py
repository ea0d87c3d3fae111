"""The governance API: a positive and a negative case for every route, and hostile
inputs (bad timezone, overlapping windows, approving one's own change or a stale
checksum, malformed plans) answered 4xx with the envelope naming the field."""

from datetime import UTC, timedelta

import pytest
from django.utils import timezone

from apps.governance import rules, services
from apps.governance.models import ReleaseWindow, ScheduledRelease
from tests import factories

pytestmark = pytest.mark.django_db

ENV = "/api/v1/environments/shop/prod"


def _client(user):
    return factories.api_client_for(user)


def _error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content[:500]
    body = response.json()["error"]
    if code is not None:
        assert body["code"] == code, body
    return body


def test_governance_shows_the_rule_and_only_owners_set_it(environment, alice, deployer,
                                                          outsider):
    response = _client(alice).put(f"{ENV}/governance", {"required_approvals": 2},
                                  format="json")
    assert response.status_code == 200 and response.json()["rule"]["required"] == 2
    body = _client(deployer).get(f"{ENV}/governance").json()
    assert body["governed"] is True and body["frozen"] is None
    _error(_client(deployer).put(f"{ENV}/governance", {"required_approvals": 0},
                                 format="json"), 403)
    _error(_client(outsider).get(f"{ENV}/governance"), 404)


def test_a_rule_naming_an_unknown_group_or_too_many_approvals_is_refused(environment, alice):
    client = _client(alice)
    body = _error(client.put(f"{ENV}/governance", {"required_approvals": 2,
                                                   "approver_groups": ["nobody"]},
                             format="json"), 400, "unknown_group")
    assert body["details"][0]["field"] == "approver_groups"
    _error(client.put(f"{ENV}/governance", {"required_approvals": 11}, format="json"), 400)
    _error(client.put(f"{ENV}/governance", {"required_approvals": "two"}, format="json"), 400)


def _submit(client, number=2, plan=None):
    return client.post(f"{ENV}/releases", {"snapshot": number,
                                           "plan": plan or {"kind": "activate"}}, format="json")


def test_submit_list_and_read_a_release(second, two_approvals, deployer):
    client = _client(deployer)
    response = _submit(client)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["checksum"] == second.checksum and body["missing"]["missing"] == 2
    assert body["rule"]["required"] == 2
    assert client.get(f"{ENV}/releases").json()["results"][0]["id"] == body["id"]
    assert client.get(f"/api/v1/releases/{body['id']}").json()["plan"] == {"kind": "activate"}
    _error(_submit(client), 409, "release_exists")


def test_submitting_needs_a_deployer_a_snapshot_and_a_valid_plan(second, member, deployer):
    _error(_submit(_client(member("viewer", username="vic"))), 403)
    client = _client(deployer)
    _error(_submit(client, number=99), 404)
    _error(_submit(client, plan={"kind": "launch"}), 400)
    body = _error(_submit(client, plan={"kind": "rollout"}), 400)
    assert "canary_agents" in str(body["details"])
    _error(client.post(f"{ENV}/releases", {"plan": {"kind": "activate"}}, format="json"), 400)
    _error(_client(deployer).get("/api/v1/releases/999999"), 404)


def _decide(client, release, verb="approve", **body):
    payload = {"checksum": release.checksum, "plan_digest": release.plan_digest, **body}
    return client.post(f"/api/v1/releases/{release.pk}/{verb}", payload, format="json")


def test_two_owners_approve_then_the_activation_goes(activation, alice, bob, deployer,
                                                     environment):
    activate = f"{ENV}/snapshots/2/activate"
    body = _error(_client(deployer).post(activate), 409, "approval_required")
    assert body["details"][0]["missing"] == 2 and body["details"][0]["release"] == activation.pk
    assert _decide(_client(alice), activation, comment="ok").status_code == 200
    response = _decide(_client(bob), activation)
    assert response.json()["missing"] is None
    assert _client(deployer).post(activate).status_code == 200
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 2


def test_approving_ones_own_change_a_stale_checksum_or_twice_is_refused(activation, alice,
                                                                        deployer, first):
    _error(_decide(_client(deployer), activation), 403, "not_an_approver")
    body = _error(_decide(_client(alice), activation, checksum=first.checksum), 409, "stale")
    assert body["details"][0]["checksum"] == activation.checksum
    _error(_decide(_client(alice), activation, plan_digest="0" * 64), 409, "stale")
    _error(_client(alice).post(f"/api/v1/releases/{activation.pk}/approve", {}, format="json"),
           400)
    assert _decide(_client(alice), activation).status_code == 200
    _error(_decide(_client(alice), activation), 409, "already_decided")


def test_reject_needs_a_comment_and_closes_the_release(activation, alice):
    body = _error(_decide(_client(alice), activation, "reject"), 400, "comment_required")
    assert body["details"][0]["field"] == "comment"
    response = _decide(_client(alice), activation, "reject", comment="not in the sale")
    assert response.json()["state"] == "rejected"
    assert response.json()["missing"]["state"] == "rejected"


def test_changing_a_release_cancels_its_approvals(activation, alice, deployer):
    _decide(_client(alice), activation)
    url = f"/api/v1/releases/{activation.pk}"
    response = _client(deployer).patch(url, {"expected_version": 1,
                                             "plan": {"kind": "push"}}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["version"] == 2 and body["decisions"][0]["cancelled_at"] is not None
    assert body["missing"]["given"] == 0
    _error(_client(deployer).patch(url, {"expected_version": 1, "plan": {"kind": "activate"}},
                                   format="json"), 409, "stale")


def test_skip_is_for_platform_admins_where_allowed(activation, superuser, alice, environment):
    url = f"/api/v1/releases/{activation.pk}/skip"
    _error(_client(alice).post(url, {"reason": "hotfix"}, format="json"), 403,
           "skip_not_allowed")
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=2,
                               admins_may_skip=True, strict=True)
    _error(_client(superuser).post(url, {}, format="json"), 400)
    response = _client(superuser).post(url, {"reason": "hotfix"}, format="json")
    assert response.status_code == 200 and response.json()["missing"] is None


def test_a_closed_release_is_not_skipped(activation, superuser, deployer, environment):
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=2,
                               admins_may_skip=True, strict=True)
    assert _client(deployer).post(f"/api/v1/releases/{activation.pk}/withdraw").status_code == 200
    _error(_client(superuser).post(f"/api/v1/releases/{activation.pk}/skip",
                                   {"reason": "hotfix"}, format="json"), 409, "release_closed")


def test_withdraw_a_release_once(activation, deployer, member):
    url = f"/api/v1/releases/{activation.pk}/withdraw"
    _error(_client(member("viewer", username="vic")).post(url), 403)
    assert _client(deployer).post(url).json()["state"] == "withdrawn"
    _error(_client(deployer).post(url), 409, "release_closed")


def test_windows_add_list_delete_and_hostile_inputs(environment, alice, deployer):
    client = _client(alice)
    weekly = {"kind": "freeze", "name": "fridays", "timezone": "Europe/Rome",
              "weekdays": [4], "start_time": "15:00", "end_time": "23:59"}
    response = client.post(f"{ENV}/windows", weekly, format="json")
    assert response.status_code == 201, response.content
    body = _error(client.post(f"{ENV}/windows", {**weekly, "name": "again",
                                                 "start_time": "20:00"}, format="json"),
                  409, "overlapping_window")
    assert body["details"][0]["overlaps"] == "fridays"
    body = _error(client.post(f"{ENV}/windows", {**weekly, "name": "tz", "timezone": "Mars/Base"},
                              format="json"), 400, "bad_timezone")
    assert body["details"][0]["field"] == "timezone"
    _error(client.post(f"{ENV}/windows", {**weekly, "name": "days", "weekdays": [7]},
                       format="json"), 400)
    _error(client.post(f"{ENV}/windows", {"kind": "freeze", "name": "back",
                                          "starts_at": "2030-01-02T00:00:00Z",
                                          "ends_at": "2030-01-01T00:00:00Z"}, format="json"),
           400)
    _error(client.post(f"{ENV}/windows", {**weekly, "name": "fridays", "weekdays": [1]},
                       format="json"), 409, "window_exists")
    _error(_client(deployer).post(f"{ENV}/windows", {**weekly, "name": "x"}, format="json"), 403)
    assert [w["name"] for w in client.get(f"{ENV}/windows").json()["results"]] == ["fridays"]
    window = ReleaseWindow.objects.get()
    _error(_client(deployer).delete(f"/api/v1/windows/{window.pk}"), 403)
    assert client.delete(f"/api/v1/windows/{window.pk}").status_code == 204
    _error(client.delete(f"/api/v1/windows/{window.pk}"), 404)


def test_a_freeze_answers_409_frozen_and_an_owner_overrides_it(second, environment, alice,
                                                               deployer):
    now = timezone.now()
    _client(alice).post(f"{ENV}/windows", {
        "kind": "freeze", "name": "sale", "starts_at": (now - timedelta(hours=1)).isoformat(),
        "ends_at": (now + timedelta(hours=1)).isoformat()}, format="json")
    body = _error(_client(deployer).post(f"{ENV}/snapshots/2/activate"), 409, "frozen")
    assert body["details"][0]["window"] == "sale"
    assert _client(deployer).get(f"{ENV}/governance").json()["frozen"]["window"] == "sale"
    _error(_client(deployer).post(f"{ENV}/freeze-override", {"reason": "x"}, format="json"),
           403)
    _error(_client(alice).post(f"{ENV}/freeze-override", {"reason": " "}, format="json"), 400)
    _error(_client(alice).post(f"{ENV}/freeze-override", {"reason": "fix", "minutes": 0},
                               format="json"), 400)
    assert _client(alice).post(f"{ENV}/freeze-override", {"reason": "outage", "minutes": 10},
                               format="json").status_code == 201
    assert _client(deployer).post(f"{ENV}/snapshots/2/activate").status_code == 200


def test_schedule_list_and_cancel(activation, deployer, member):
    client = _client(deployer)
    url = f"/api/v1/releases/{activation.pk}/schedule"
    run_at = (timezone.now() + timedelta(hours=1)).isoformat()
    _error(client.post(url, {"run_at": run_at, "expected_version": 2}, format="json"), 409,
           "stale")
    _error(client.post(url, {"run_at": "2000-01-01T00:00:00Z", "expected_version": 1},
                       format="json"), 400)
    _error(client.post(url, {"run_at": "soon", "expected_version": 1}, format="json"), 400)
    response = client.post(url, {"run_at": run_at, "expected_version": 1}, format="json")
    assert response.status_code == 201, response.content
    schedule_id = response.json()["id"]
    assert client.get(f"{ENV}/schedules").json()["results"][0]["expected_active_snapshot"] == 1
    cancel = f"/api/v1/schedules/{schedule_id}/cancel"
    _error(_client(member("viewer", username="vic")).post(cancel), 403)
    assert client.post(cancel).json()["state"] == "cancelled"
    _error(client.post(cancel), 409, "schedule_finished")
    assert ScheduledRelease.objects.get().state == "cancelled"


def test_scheduling_the_activation_of_the_active_snapshot_is_refused(first, environment,
                                                                     deployer, two_approvals):
    """It would start nothing and leave its release open: 409 naming the snapshot."""
    release = services.release_submit(environment=environment, snapshot=first,
                                      plan=rules.activation_plan(), actor=deployer)
    run_at = (timezone.now() + timedelta(hours=1)).isoformat()
    body = _error(_client(deployer).post(f"/api/v1/releases/{release.pk}/schedule",
                                         {"run_at": run_at, "expected_version": 1},
                                         format="json"), 409, "already_active")
    assert body["details"] == [{"snapshot": 1}]
    assert not ScheduledRelease.objects.exists()


def test_a_rollout_through_the_api_names_its_missing_approval(second, environment, deployer,
                                                              two_approvals):
    node = factories.enrolled_agents(environment, 1)[0]
    body = _error(_client(deployer).post(f"{ENV}/rollouts", {
        "snapshot": 2, "canary_agents": [node.pk]}, format="json"), 409, "approval_required")
    assert body["details"][0]["plan_digest"] == rules.plan_digest(
        rules.rollout_plan(canary_agents=[node.pk]))


def test_a_one_off_window_reads_a_time_without_offset_in_its_timezone(environment, alice):
    client = _client(alice)
    response = client.post(f"{ENV}/windows", {
        "kind": "freeze", "name": "rome", "timezone": "Europe/Rome",
        "starts_at": "2030-01-01T10:00:00", "ends_at": "2030-01-01T12:00:00"}, format="json")
    assert response.status_code == 201, response.content
    response = client.post(f"{ENV}/windows", {
        "kind": "freeze", "name": "offset", "timezone": "America/New_York",
        "starts_at": "2030-02-01T10:00:00+01:00", "ends_at": "2030-02-01T12:00:00+01:00"},
        format="json")
    assert response.status_code == 201, response.content
    rome, offset = (ReleaseWindow.objects.get(name=n) for n in ("rome", "offset"))
    assert rome.starts_at.astimezone(UTC).hour == 9  # 10:00 in Rome, winter
    assert offset.starts_at.astimezone(UTC).hour == 9  # the offset given wins
