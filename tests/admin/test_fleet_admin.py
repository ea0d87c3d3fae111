"""Enrollment tokens and agents in the admin: scoped, actions through the services."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.fleet.models import Agent, EnrollmentToken
from apps.fleet.services import agent_enroll, enrollment_token_create
from tests.admin.support import listed, messages_of, publish

TOKENS = "/admin/fleet/enrollmenttoken/"
AGENTS = "/admin/fleet/agent/"


@pytest.fixture
def agent(environment, superuser):
    publish(environment, superuser)
    _, secret = enrollment_token_create(environment=environment, max_uses=1, actor=superuser,
                                        expires_at=timezone.now() + timedelta(hours=1))
    return agent_enroll(enrollment_token=secret, name="web-1", labels={})[0]


def test_adding_an_enrollment_token_shows_its_secret_once(login, tenant_owner, environment):
    client = login(tenant_owner)

    response = client.post(f"{TOKENS}add/", {"environment": environment.pk, "name": "racks",
                                             "max_uses": 3, "expires_in_hours": 2},
                           follow=True)

    token = EnrollmentToken.objects.get()
    shown = [m for m in messages_of(response) if f"bwe_{token.key}." in m]
    assert len(shown) == 1
    secret = shown[0].rsplit(" ", 1)[1]
    assert secret.split(".", 1)[1] not in token.secret_hash
    assert (token.max_uses, token.name, token.environment) == (3, "racks", environment)
    assert secret not in client.get(f"{TOKENS}{token.pk}/change/").content.decode()


def test_agents_list_shows_status_and_only_owned_environments(login, tenant_owner,
                                                              staff_outsider, agent):
    response = login(tenant_owner).get(AGENTS)
    assert listed(response) == [agent]
    assert "#1" in response.content.decode()  # desired snapshot

    assert listed(login(staff_outsider).get(AGENTS)) == []


def test_switching_mode_from_the_admin_goes_through_the_service(login, tenant_owner, agent):
    login(tenant_owner).post(AGENTS, {"action": "switch_to_manual",
                                      "_selected_action": [agent.pk]})

    agent.refresh_from_db()
    assert agent.mode == "manual"
    assert agent.target_snapshot.number == 1  # stays on its current snapshot
    assert AuditEvent.objects.filter(action="agent.update", object_id=str(agent.pk)).exists()


def test_revoking_a_token_from_the_admin(login, tenant_owner, agent):
    login(tenant_owner).post(AGENTS, {"action": "revoke_token", "_selected_action": [agent.pk]})

    assert Agent.objects.get(pk=agent.pk).token_revoked_at is not None
