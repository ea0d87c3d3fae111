"""Rules from the review of the fleet: no stale cached answers, no going back through a
mode switch, report payloads bound to their deployment, blocked versions clearing,
disabled agents left out of pushes."""


from apps.fleet import enrollment, selectors, services
from apps.fleet.models import Agent, Deployment
from tests.api_helpers import assert_error
from tests.factories import bearer_client, poll, publish_variant
from tests.fleet.support import agent_url, deploy_url, report


def test_a_stored_poll_answer_is_current_until_the_state_changes(enroll, first, superuser,
                                                                 environment):
    agent = enroll()
    etag = poll(bearer_client(agent.token))["ETag"]
    key = agent.agent.token_key

    assert selectors.poll_state_current(agent.agent.pk, token_key=key, etag=etag)
    publish_variant(environment, superuser, workers=8)
    assert not selectors.poll_state_current(agent.agent.pk, token_key=key, etag=etag)


def test_a_revoked_token_makes_its_stored_answer_stale(enroll, first, superuser):
    agent = enroll()
    etag = poll(bearer_client(agent.token))["ETag"]

    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)

    assert not selectors.poll_state_current(agent.agent.pk, token_key=agent.agent.token_key,
                                            etag=etag)


def test_switching_to_auto_pull_is_refused_while_the_agent_is_ahead(
        enroll, first, environment, superuser, deployer):
    ahead = enroll("web-1", mode="manual")
    environment.release_policy = "staged"
    environment.save(update_fields=["release_policy"])
    second = publish_variant(environment, superuser, workers=8)
    assert deployer.post(deploy_url(2), {"agents": [ahead.agent.pk]},
                         format="json").status_code == 201
    deployment = Deployment.objects.get(agent=ahead.agent, snapshot=second)
    report(bearer_client(ahead.token), second, deployment_id=deployment.pk)

    response = deployer.patch(agent_url(ahead.agent.pk), {"mode": "auto_pull"},
                              format="json")

    assert_error(response, 409, "rollback_required")
    assert Agent.objects.get(pk=ahead.agent.pk).mode == "manual"


def test_a_report_for_a_deployment_with_another_snapshot_is_a_conflict(
        enroll, first, environment, superuser, deployer):
    agent = enroll()
    assert deployer.post(deploy_url(1), {"agents": [agent.agent.pk]},
                         format="json").status_code == 201
    deployment = Deployment.objects.get(agent=agent.agent)
    second = publish_variant(environment, superuser, workers=8)

    response = report(bearer_client(agent.token), second, deployment_id=deployment.pk)

    assert_error(response, 409, "report_conflict")


def test_a_later_success_clears_an_older_blocked_version(enroll, first, environment, superuser):
    agent = enroll()
    client = bearer_client(agent.token)
    second = publish_variant(environment, superuser, workers=8)
    report(client, second, status="failed", message="validate failed")
    third = publish_variant(environment, superuser, workers=9)

    report(client, third)

    refreshed = Agent.objects.get(pk=agent.agent.pk)
    assert refreshed.blocked_number is None
    assert refreshed.applied_number == third.number


def test_an_explicit_push_to_a_disabled_agent_is_refused(enroll, first, superuser, deployer):
    agent = enroll()
    services.agent_update(agent=agent.agent, actor=superuser, enabled=False)

    response = deployer.post(deploy_url(1), {"agents": [agent.agent.pk]}, format="json")

    assert_error(response, 409, "agent_disabled")
    assert not Deployment.objects.exists()


def test_a_huge_agent_id_in_a_push_is_a_400(first, deployer):
    response = deployer.post(deploy_url(1), {"agents": [10**20]}, format="json")

    assert_error(response, 400)
