"""Push deploys, modes, supersede rules and explicit activation."""

import pytest

from apps.fleet import heartbeats, services
from apps.fleet.models import Deployment
from apps.releases.publishing import publication_abandon
from apps.releases.services import environment_update, snapshot_publish
from tests.api_helpers import assert_error
from tests.factories import poll, publish, publish_variant, rollback_publication
from tests.fleet.support import activate_url, agent_url, deploy_url, report


def _push(client, number: int, agents):
    return client.post(deploy_url(number), {"agents": [a.agent.pk for a in agents]},
                       format="json")


def _states(*agents) -> list[list[tuple[int, str]]]:
    return [sorted((d.snapshot.number, d.state) for d in Deployment.objects.filter(
        agent=a.agent).select_related("snapshot")) for a in agents]


# -- push ---------------------------------------------------------------------------------


def test_push_creates_pending_deployments_announced_in_desired(deployer, enroll, first):
    one, two = enroll("web-1"), enroll("web-2", mode="manual")

    response = _push(deployer, 1, [one, two])

    assert response.status_code == 201
    body = response.json()
    assert [(d["agent"], d["snapshot"], d["kind"], d["state"]) for d in body] == [
        (one.agent.pk, 1, "push", "pending"), (two.agent.pk, 1, "push", "pending")]
    assert {"id", "message", "created_at", "reported_at"} <= set(body[0])
    for agent, deployment in zip([one, two], body, strict=True):
        desired = poll(agent.client).json()
        assert desired["deployment_id"] == deployment["id"]
        assert desired["snapshot"]["number"] == 1
    assert Deployment.objects.get(pk=body[0]["id"]).created_by.username == "deployer-user"


def test_push_names_agents_by_name_or_id_and_refuses_an_unknown_name(deployer, enroll, first):
    one, two = enroll("web-1"), enroll("web-2")

    named = deployer.post(deploy_url(1), {"agents": ["web-2", one.agent.pk]}, format="json")
    unknown = deployer.post(deploy_url(1), {"agents": ["web-1", "web-7"]}, format="json")

    assert named.status_code == 201, named.content
    assert sorted(d["agent"] for d in named.json()) == sorted([one.agent.pk, two.agent.pk])
    assert unknown.status_code == 400 and unknown.json()["error"]["code"] == "unknown_agents"
    assert unknown.json()["error"]["details"][0]["agents"] == ["web-7"]
    assert Deployment.objects.filter(kind="push").count() == 2  # the refused one wrote nothing


def test_push_with_an_empty_list_targets_all_enabled_agents(deployer, enroll, first,
                                                            superuser):
    one, two, off = enroll("web-1"), enroll("web-2", mode="manual"), enroll("web-3")
    services.agent_update(agent=off.agent, actor=superuser, enabled=False)

    response = deployer.post(deploy_url(1), {"agents": []}, format="json")
    spelled_out = deployer.post(deploy_url(1), {"agents": "all"}, format="json")

    assert response.status_code == 201
    assert sorted(d["agent"] for d in response.json()) == sorted([one.agent.pk, two.agent.pk])
    assert spelled_out.status_code == 201
    assert sorted(d["agent"] for d in spelled_out.json()) == sorted([one.agent.pk, two.agent.pk])
    assert not Deployment.objects.filter(agent=off.agent).exists()


@pytest.mark.parametrize("body", [None, "", "{}", '{"agents": null}', '{"agents": "every"}',
                                  '{"agents": {}}', '{"reason": "x"}', "[]"])
def test_push_without_an_agents_selection_in_the_body_is_400_and_pushes_nothing(
        deployer, enroll, first, body):
    enroll("web-1")
    enroll("web-2")
    if body is None:
        response = deployer.post(deploy_url(1))
    else:
        response = deployer.post(deploy_url(1), data=body, content_type="application/json")
    assert_error(response, 400)
    assert not Deployment.objects.exists()


def test_push_with_a_json_body_but_no_content_type_pushes_nothing(deployer, enroll, first):
    enroll("web-1")
    response = deployer.generic("POST", deploy_url(1), b'{"agents": []}', content_type="")
    assert response.status_code in (400, 415)
    assert not Deployment.objects.exists()


def test_push_sets_the_target_of_manual_agents(deployer, enroll, first, environment,
                                               superuser):
    manual = enroll(mode="manual")
    publish_variant(environment, superuser, workers=8)
    assert manual.fresh().target_snapshot.number == 1

    _push(deployer, 2, [manual])

    assert manual.fresh().target_snapshot.number == 2
    assert poll(manual.client).json()["snapshot"]["number"] == 2


def test_push_of_an_older_snapshot_to_auto_pull_agents_is_rollback_required(
    deployer, enroll, first, environment, superuser
):
    follower, manual = enroll("web-1"), enroll("web-2", mode="manual")
    publish_variant(environment, superuser, workers=8)

    response = _push(deployer, 1, [follower, manual])

    error = assert_error(response, 409, "rollback_required")
    assert [(d["agent"], d["name"]) for d in error["details"]] == [
        (follower.agent.pk, "web-1")]
    assert not Deployment.objects.exists()
    assert manual.fresh().target_snapshot.number == 1


def test_push_onto_an_agent_with_a_newer_applied_snapshot_is_rollback_required(
    deployer, enroll, first, environment, superuser
):
    manual = enroll(mode="manual")
    second = publish_variant(environment, superuser, workers=8)
    _push(deployer, 2, [manual])
    report(manual.client, second)

    response = _push(deployer, 1, [manual])

    error = assert_error(response, 409, "rollback_required")
    assert error["details"][0]["agent"] == manual.agent.pk
    assert error["details"][0]["name"] == "web-1"
    assert "#2" in error["details"][0]["reason"]
    assert manual.fresh().target_snapshot.number == 2


def test_push_of_a_not_yet_active_snapshot_to_auto_pull_agents_is_refused(
    deployer, enroll, first, environment, superuser
):
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    follower = enroll()
    publish_variant(environment, superuser, workers=8)

    response = _push(deployer, 2, [follower])

    error = assert_error(response, 409, "not_active")
    assert "activate" in error["message"]
    assert not Deployment.objects.exists()


def test_re_pushing_the_active_snapshot_is_allowed(deployer, enroll, first):
    agent = enroll()
    report(agent.client, first)

    response = _push(deployer, 1, [agent])

    assert response.status_code == 201
    assert poll(agent.client).json()["deployment_id"] == response.json()[0]["id"]


def test_newer_push_supersedes_older_pending_ones(deployer, enroll, first, environment,
                                                  superuser):
    manual = enroll(mode="manual")
    older = _push(deployer, 1, [manual]).json()[0]
    publish_variant(environment, superuser, workers=8)

    newer = _push(deployer, 2, [manual]).json()[0]

    assert Deployment.objects.get(pk=older["id"]).state == "superseded"
    assert Deployment.objects.get(pk=newer["id"]).state == "pending"
    assert poll(manual.client).json()["deployment_id"] == newer["id"]


def test_push_to_an_offline_agent_stays_pending_until_it_polls(deployer, enroll, first):
    offline = enroll()
    pushed = _push(deployer, 1, [offline]).json()[0]
    heartbeats.heartbeats_flush()

    assert Deployment.objects.get(pk=pushed["id"]).state == "pending"
    assert poll(offline.client).json()["deployment_id"] == pushed["id"]
    assert Deployment.objects.get(pk=pushed["id"]).state == "pending"


def test_push_needs_the_deployer_role(client_for, enroll, first):
    agent = enroll()

    response = _push(client_for("viewer"), 1, [agent])

    assert_error(response, 403, "permission_denied")
    assert not Deployment.objects.exists()


def test_push_by_an_outsider_is_404(api_client, outsider, enroll, first):
    agent = enroll()

    response = _push(api_client(outsider), 1, [agent])

    assert_error(response, 404, "not_found")
    assert not Deployment.objects.exists()


def test_push_to_an_agent_of_another_environment_is_400_naming_the_field_and_ids(
        deployer, enroll, first, blog):
    foreign, mine = enroll("web-1", env=blog), enroll("web-2")

    response = _push(deployer, 1, [foreign, mine])

    error = assert_error(response, 400, "unknown_agents")
    assert error["details"] == [{"field": "agents", "message": "no agents of shop/prod",
                                 "agents": [foreign.agent.pk]}]
    assert not Deployment.objects.exists()


def test_push_of_an_unknown_snapshot_is_404(deployer, enroll, first):
    assert_error(_push(deployer, 9, [enroll()]), 404, "not_found")


def test_push_of_an_invalid_snapshot_is_409(deployer, enroll, first, environment, superuser):
    manual = enroll(mode="manual")
    publication = snapshot_publish(environment=environment, actor=superuser)
    publication_abandon(publication_id=str(publication.pk), reason="test")

    response = _push(deployer, 2, [manual])

    assert_error(response, 409, "not_ready")


def test_push_without_enabled_agents_is_400(deployer, first):
    response = deployer.post(deploy_url(1), {"agents": []}, format="json")

    assert_error(response, 400, "no_agents")


@pytest.mark.parametrize("agents", [["a"], [0], "1", None])
def test_push_with_a_bad_agent_list_is_400(agents, deployer, enroll, first):
    enroll()

    response = deployer.post(deploy_url(1), {"agents": agents}, format="json")

    assert_error(response, 400)
    assert not Deployment.objects.exists()


# -- supersede on activation and mode switches --------------------------------------------


def test_activation_of_a_newer_snapshot_supersedes_pushes_of_auto_pull_agents(
    deployer, enroll, first, environment, superuser
):
    follower, manual = enroll("web-1"), enroll("web-2", mode="manual")
    _push(deployer, 1, [follower, manual])

    publish_variant(environment, superuser, workers=8)

    assert _states(follower, manual) == [[(1, "superseded")], [(1, "pending")]]
    assert poll(follower.client).json()["deployment_id"] is None
    assert poll(manual.client).json()["deployment_id"] is not None


def test_switching_to_auto_pull_supersedes_pushes_of_other_snapshots(
    deployer, enroll, first, environment, superuser, django_capture_on_commit_callbacks
):
    manual = enroll(mode="manual")
    publish_variant(environment, superuser, workers=8)
    _push(deployer, 1, [manual])
    etag = poll(manual.client)["ETag"]

    with django_capture_on_commit_callbacks(execute=True):
        patched = deployer.patch(agent_url(manual.agent.pk), {"mode": "auto_pull"},
                                 format="json")
    desired = poll(manual.client, etag)

    assert patched.status_code == 200
    assert _states(manual) == [[(1, "superseded")]]
    assert desired.status_code == 200
    assert (desired.json()["snapshot"]["number"], desired.json()["deployment_id"]) == (2, None)


def test_switching_to_auto_pull_keeps_a_push_of_the_active_snapshot(deployer, enroll, first):
    manual = enroll(mode="manual")
    pushed = _push(deployer, 1, [manual]).json()[0]

    deployer.patch(agent_url(manual.agent.pk), {"mode": "auto_pull"}, format="json")

    assert _states(manual) == [[(1, "pending")]]
    assert poll(manual.client).json()["deployment_id"] == pushed["id"]


def test_manual_agent_ignores_new_publishes(enroll, first, environment, superuser):
    manual = enroll(mode="manual")
    generation = manual.fresh().generation

    publish_variant(environment, superuser, workers=8)

    assert poll(manual.client).json()["snapshot"]["number"] == 1
    assert manual.fresh().generation == generation


# -- explicit activation ------------------------------------------------------------------


@pytest.fixture
def gated(environment, superuser):
    """shop/prod where publishing does not activate."""
    return environment_update(environment=environment, release_policy="staged",
                              actor=superuser)


def test_publish_does_not_change_desired_when_activation_is_required(gated, enroll,
                                                                     superuser):
    agent = enroll()
    snapshot = publish(gated, superuser)

    gated.refresh_from_db()
    assert snapshot.state == "ready"
    assert gated.active_snapshot is None
    assert poll(agent.client).json()["snapshot"] is None


def test_activate_makes_auto_pull_agents_follow(gated, enroll, superuser, deployer,
                                                django_capture_on_commit_callbacks):
    follower, manual = enroll("web-1"), enroll("web-2", mode="manual")
    publish(gated, superuser)
    etag = poll(follower.client)["ETag"]

    with django_capture_on_commit_callbacks(execute=True):
        response = deployer.post(activate_url(1))
    desired = poll(follower.client, etag)

    assert (response.status_code, response.json()) == (200, {"active": 1})
    assert desired.status_code == 200
    assert desired.json()["snapshot"]["number"] == 1
    assert poll(manual.client).json()["snapshot"] is None


def test_newer_publish_waits_for_activation(gated, enroll, superuser, deployer):
    agent = enroll()
    publish(gated, superuser)
    deployer.post(activate_url(1))

    publish_variant(gated, superuser, workers=8)
    before = poll(agent.client).json()["snapshot"]["number"]
    deployer.post(activate_url(2))
    after = poll(agent.client).json()["snapshot"]["number"]

    assert (before, after) == (1, 2)


def test_activating_an_older_snapshot_is_rollback_required(gated, superuser, deployer):
    publish(gated, superuser)
    publish_variant(gated, superuser, workers=8)
    deployer.post(activate_url(2))

    response = deployer.post(activate_url(1))

    assert_error(response, 409, "rollback_required")
    gated.refresh_from_db()
    assert gated.active_snapshot.number == 2


def test_activating_the_active_snapshot_again_changes_nothing(gated, superuser, deployer,
                                                              enroll):
    agent = enroll()
    publish(gated, superuser)
    deployer.post(activate_url(1))
    generation = agent.fresh().generation

    response = deployer.post(activate_url(1))

    assert response.status_code == 200
    assert agent.fresh().generation == generation


def test_activation_needs_the_deployer_role(gated, superuser, client_for):
    publish(gated, superuser)

    response = client_for("viewer").post(activate_url(1))

    assert_error(response, 403, "permission_denied")
    gated.refresh_from_db()
    assert gated.active_snapshot is None


def test_activation_by_an_outsider_is_404(gated, superuser, api_client, outsider):
    publish(gated, superuser)

    assert_error(api_client(outsider).post(activate_url(1)), 404, "not_found")


def test_activating_an_invalid_snapshot_is_409(gated, superuser, deployer):
    publication = snapshot_publish(environment=gated, actor=superuser)
    publication_abandon(publication_id=str(publication.pk), reason="test")

    assert_error(deployer.post(activate_url(1)), 409, "not_ready")


def test_activating_an_unknown_snapshot_is_404(gated, deployer):
    assert_error(deployer.post(activate_url(5)), 404, "not_found")


# -- rollback -----------------------------------------------------------------------------


def test_auto_pull_agents_follow_a_rollback_at_a_higher_number(enroll, first, environment,
                                                              superuser):
    agent = enroll()
    publish_variant(environment, superuser, workers=8)
    report(agent.client, environment.snapshots.get(number=2))

    rolled = rollback_publication(first, superuser).snapshot
    desired = poll(agent.client).json()["snapshot"]

    assert (rolled.number, rolled.checksum) == (3, first.checksum)
    assert (desired["number"], desired["checksum"]) == (3, first.checksum)


def test_rollback_activates_even_when_activation_is_required(enroll, first, environment,
                                                             superuser):
    agent = enroll()
    publish_variant(environment, superuser, workers=8)
    gated = environment_update(environment=environment, release_policy="staged",
                               actor=superuser)

    rollback_publication(first, superuser)

    gated.refresh_from_db()
    assert gated.active_snapshot.number == 3
    assert poll(agent.client).json()["snapshot"]["number"] == 3


def test_manual_agents_stay_on_their_target_after_a_rollback(enroll, first, environment,
                                                             superuser):
    manual = enroll(mode="manual")
    publish_variant(environment, superuser, workers=8)

    rollback_publication(first, superuser)

    assert poll(manual.client).json()["snapshot"]["number"] == 1
