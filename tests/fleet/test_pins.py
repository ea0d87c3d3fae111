"""Operator pins: a hold on a snapshot that wins over activation and push."""

import pytest

from apps.audit.models import AuditEvent
from apps.fleet.models import Agent
from tests.api_helpers import assert_error
from tests.factories import bearer_client, poll, publish_variant
from tests.fleet.support import agent_url, deploy_url, report


def _pin(client, agent, number, generation=None):
    generation = Agent.objects.get(pk=agent.pk).generation if generation is None else generation
    return client.post(agent_url(agent.pk, "/pin"),
                       {"snapshot": number, "expected_generation": generation}, format="json")


def _release(client, agent, generation=None):
    generation = Agent.objects.get(pk=agent.pk).generation if generation is None else generation
    return client.post(agent_url(agent.pk, "/pin/release"),
                       {"expected_generation": generation}, format="json")


def test_a_pinned_agent_stays_on_its_snapshot_when_another_is_activated(
        enroll, first, environment, superuser, deployer, django_capture_on_commit_callbacks):
    agent = enroll()
    with django_capture_on_commit_callbacks(execute=True):
        assert _pin(deployer, agent.agent, 1).status_code == 200
    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)

    body = poll(bearer_client(agent.token)).json()

    assert body["snapshot"]["number"] == 1
    status = deployer.get(agent_url(agent.agent.pk)).json()["status"]
    assert status["pinned"]["number"] == 1
    assert AuditEvent.objects.filter(action="agent.pin").exists()


def test_releasing_the_pin_follows_the_active_snapshot_again(
        enroll, first, environment, superuser, deployer, django_capture_on_commit_callbacks):
    agent = enroll()
    _pin(deployer, agent.agent, 1)
    publish_variant(environment, superuser, workers=8)

    with django_capture_on_commit_callbacks(execute=True):
        response = _release(deployer, agent.agent)

    assert response.status_code == 200
    assert response.json()["status"]["pinned"] is None
    assert poll(bearer_client(agent.token)).json()["snapshot"]["number"] == 2


def test_pinning_to_what_it_follows_keeps_the_answer_but_moves_the_generation(
        enroll, first, deployer, django_capture_on_commit_callbacks):
    agent = enroll()
    client = bearer_client(agent.token)
    etag = poll(client)["ETag"]
    generation = Agent.objects.get(pk=agent.agent.pk).generation

    with django_capture_on_commit_callbacks(execute=True):
        _pin(deployer, agent.agent, 1)

    assert poll(client, etag).status_code == 304  # still #1: nothing to apply
    assert Agent.objects.get(pk=agent.agent.pk).generation == generation + 1


def test_a_stale_expected_generation_is_a_conflict(enroll, first, deployer):
    agent = enroll()

    response = _pin(deployer, agent.agent, 1, generation=999)

    error = assert_error(response, 409, "stale")
    assert error["details"][0]["generation"] == Agent.objects.get(pk=agent.agent.pk).generation
    assert Agent.objects.get(pk=agent.agent.pk).pinned_snapshot is None


def test_pinning_below_what_the_agent_applied_needs_a_rollback(enroll, first, environment,
                                                               superuser, deployer):
    agent = enroll()
    second = publish_variant(environment, superuser, workers=8)
    report(bearer_client(agent.token), second)

    assert_error(_pin(deployer, agent.agent, 1), 409, "rollback_required")


def test_pushing_to_a_pinned_agent_is_refused(enroll, first, deployer):
    agent = enroll()
    _pin(deployer, agent.agent, 1)

    response = deployer.post(deploy_url(1), {"agents": [agent.agent.pk]}, format="json")

    assert_error(response, 409, "agent_pinned")


def test_releasing_an_agent_that_is_not_pinned_is_a_conflict(enroll, first, deployer):
    assert_error(_release(deployer, enroll().agent), 409, "not_pinned")


@pytest.mark.parametrize("role", ["viewer"])
def test_a_viewer_may_not_pin(enroll, first, client_for, role):
    assert_error(_pin(client_for(role), enroll().agent, 1), 403, "permission_denied")


def test_pinning_to_an_unknown_snapshot_is_404(enroll, first, deployer):
    assert_error(_pin(deployer, enroll().agent, 99), 404, "not_found")
