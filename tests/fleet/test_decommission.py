"""Decommissioning an agent (POST /api/v1/agents/<id>/decommission, the admin action):
its token is refused at once, its history kept, its name free for a new agent."""

import pytest

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict
from apps.fleet import enrollment
from apps.fleet import services as fleet_services
from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from tests.api_helpers import assert_error
from tests.factories import enrolled_agent, poll
from tests.fleet.support import AGENTS, agent_url, deploy_url, enroll_over_http, report

pytestmark = pytest.mark.django_db


def _decommission(client, agent, generation=None):
    generation = agent.agent.generation if generation is None else generation
    return client.post(agent_url(agent.pk, "/decommission"),
                       {"expected_generation": generation}, format="json")


def _warm(client) -> str:
    """Poll twice: the second poll is answered 304 from the cache."""
    etag = poll(client)["ETag"]
    assert poll(client, etag).status_code == 304
    return etag


def test_owner_decommissions_an_agent_and_its_token_is_refused_at_once(
    enroll, first, client_for, django_capture_on_commit_callbacks
):
    agent = enroll("web-1")
    etag = _warm(agent.client)

    with django_capture_on_commit_callbacks(execute=True):
        response = _decommission(client_for("owner"), agent)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["decommissioned_at"] is not None
    assert body["generation"] == 2
    cached, plain = poll(agent.client, etag), poll(agent.client)
    error = assert_error(cached, 401, "authentication_failed")
    assert "decommissioned" in error["message"]
    assert_error(plain, 401, "authentication_failed")
    assert_error(report(agent.client, first), 401, "authentication_failed")
    event = AuditEvent.objects.get(action="agent.decommission", object_id=str(agent.pk))
    assert event.data["name"] == "web-1"


def test_decommissioned_agent_keeps_its_history_and_its_name_is_free(
    enroll, first, client_for, enrollment_token
):
    old = enroll("web-1")
    assert report(old.client, first).status_code == 201
    owner = client_for("owner")
    assert _decommission(owner, old).status_code == 200

    _, secret = enrollment_token()
    enrolled = enroll_over_http(secret, name="web-1")

    assert enrolled.status_code == 201, enrolled.content
    new_id = enrolled.json()["agent_id"]
    assert new_id != old.pk
    assert Agent.objects.filter(name="web-1").count() == 2
    # History stays with the old agent, readable through the API.
    history = owner.get(agent_url(old.pk, "/deployments")).json()
    assert [(d["snapshot"], d["state"]) for d in history["results"]] == [(1, "succeeded")]
    assert owner.get(agent_url(old.pk)).json()["decommissioned_at"] is not None
    assert AuditEvent.objects.filter(object_id=str(old.pk), action="agent.enroll").exists()
    # A second agent in service may not take the name.
    _, another = enrollment_token()
    assert_error(enroll_over_http(another, name="web-1"), 409, "name_taken")


def test_agents_list_hides_decommissioned_agents_unless_asked(enroll, first, client_for):
    gone, kept = enroll("web-1"), enroll("web-2")
    viewer = client_for("viewer")
    assert _decommission(client_for("owner"), gone).status_code == 200

    def names(query=""):
        response = viewer.get(AGENTS + query)
        assert response.status_code == 200, response.content
        return [row["name"] for row in response.json()["results"]]

    assert names() == names("?decommissioned=false") == ["web-2"]
    assert names("?decommissioned=true") == ["web-1"]
    assert names("?decommissioned=any") == ["web-1", "web-2"]
    assert_error(viewer.get(AGENTS + "?decommissioned=maybe"), 400)
    assert kept.pk


@pytest.mark.parametrize("role", ["viewer", "deployer"])
def test_viewer_and_deployer_may_not_decommission(role, enroll, first, client_for):
    agent = enroll("web-1")

    assert_error(_decommission(client_for(role), agent), 403)

    assert Agent.objects.get(pk=agent.pk).decommissioned_at is None


def test_stale_generation_is_409_naming_the_current_one(enroll, first, client_for):
    agent = enroll("web-1")
    owner = client_for("owner")

    error = assert_error(_decommission(owner, agent, generation=7), 409, "stale")

    assert error["details"] == [{"agent": agent.pk, "generation": 1}]
    assert Agent.objects.get(pk=agent.pk).decommissioned_at is None


@pytest.mark.parametrize("body", [{}, {"expected_generation": 0},
                                  {"expected_generation": "one"}])
def test_missing_or_bad_generation_is_400(body, enroll, first, client_for):
    agent = enroll("web-1")

    response = client_for("owner").post(agent_url(agent.pk, "/decommission"), body,
                                        format="json")

    assert_error(response, 400)


def test_decommissioning_twice_is_409_naming_the_state(enroll, first, client_for):
    agent = enroll("web-1")
    owner = client_for("owner")
    assert _decommission(owner, agent).status_code == 200

    error = assert_error(_decommission(owner, agent, generation=2), 409, "decommissioned")

    assert "web-1 is decommissioned" in error["message"]
    assert AuditEvent.objects.filter(action="agent.decommission").count() == 1


def test_another_tenants_agent_is_404(blog, outsider, client_for):
    theirs = enrolled_agent(blog, "web-1", actor=outsider)

    response = _decommission(client_for("owner"), theirs)

    assert_error(response, 404, "not_found")
    assert Agent.objects.get(pk=theirs.pk).decommissioned_at is None


def test_decommissioned_agent_takes_no_further_change(enroll, first, client_for, superuser):
    agent = enroll("web-1")
    owner = client_for("owner")
    assert _decommission(owner, agent).status_code == 200
    generation = Agent.objects.get(pk=agent.pk).generation

    rotate = owner.post(agent_url(agent.pk, "/token/rotate"))
    patch = owner.patch(agent_url(agent.pk), {"mode": "manual"}, format="json")
    pin = owner.post(agent_url(agent.pk, "/pin"),
                     {"snapshot": 1, "expected_generation": generation}, format="json")
    push = owner.post(deploy_url(1), {"agents": [agent.pk]}, format="json")

    for response in (rotate, patch, pin, push):
        error = assert_error(response, 409, "decommissioned")
        assert "web-1 is decommissioned" in error["message"]
    # Its token was not brought back by a rotation.
    assert_error(poll(agent.client), 401, "authentication_failed")


def test_push_to_all_skips_decommissioned_agents(enroll, first, client_for):
    gone, kept = enroll("web-1"), enroll("web-2")
    assert _decommission(client_for("owner"), gone).status_code == 200

    response = client_for("deployer").post(deploy_url(1), {"agents": []}, format="json")

    assert response.status_code == 201, response.content
    assert [d["agent"] for d in response.json()] == [kept.pk]


def test_decommissioning_releases_an_operators_pin_and_closes_pending_pushes(
    enroll, first, superuser
):
    agent = enroll("web-1", mode="manual")
    releases.snapshot_deploy(snapshot=first, agent_ids=[agent.pk], actor=superuser)
    held = releases.agent_pin(agent=agent.fresh(), snapshot=first, actor=superuser,
                              expected_generation=agent.fresh().generation)

    gone = releases.agent_decommission(agent=held, expected_generation=held.generation,
                                       actor=superuser)

    gone.refresh_from_db()
    assert (gone.pinned_snapshot_id, gone.pin_rollout_id, gone.is_held) == (None, None, False)
    assert gone.token_revoked_at is not None and gone.is_decommissioned
    assert not Deployment.objects.filter(agent=gone, state="pending").exists()
    event = AuditEvent.objects.get(action="agent.decommission")
    assert event.data["released_pin"] == 1


def test_decommissioned_agent_follows_nothing_and_stays_unchanged(enroll, first, superuser):
    agent = enroll("web-1")
    releases.agent_decommission(agent=agent.agent, expected_generation=1, actor=superuser)
    generation = Agent.objects.get(pk=agent.pk).generation

    with pytest.raises(Conflict):
        fleet_services.agent_update(agent=agent.fresh(), actor=superuser, enabled=False)
    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)  # already: a no-op

    assert Agent.objects.get(pk=agent.pk).generation == generation
    assert Agent.objects.following_active().count() == 0
