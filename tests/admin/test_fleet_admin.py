"""Enrollment tokens and agents in the admin: scoped, actions through the services."""

import pytest

from apps.audit.models import AuditEvent
from apps.fleet.models import Agent, Deployment, EnrollmentToken
from apps.releases.services import agent_pin
from apps.snapshots.models import Snapshot
from tests.admin.support import listed, messages_of
from tests.factories import enrolled_agent, publish

TOKENS = "/admin/fleet/enrollmenttoken/"
AGENTS = "/admin/fleet/agent/"


@pytest.fixture
def agent(environment, superuser):
    publish(environment, superuser)
    return enrolled_agent(environment, "web-1", actor=superuser).agent


def test_adding_an_enrollment_token_shows_its_secret_once(login, tenant_owner, environment):
    client = login(tenant_owner)

    response = client.post(f"{TOKENS}add/", {"environment": environment.pk, "name": "racks",
                                             "max_uses": 3, "expires_in_hours": 2},
                           follow=True)

    token = EnrollmentToken.objects.get()
    shown = [m for m in messages_of(response)
             if f"bwe_{token.key}." in m and "shown only once" in m]
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


def test_deploy_now_pushes_the_active_snapshot_to_the_selected_agents(login, tenant_owner,
                                                                      agent):
    response = login(tenant_owner).post(AGENTS, {"action": "deploy_now",
                                                 "_selected_action": [agent.pk]}, follow=True)

    deployment = Deployment.objects.get(agent=agent)
    assert (deployment.kind, deployment.state, deployment.snapshot.number) == (
        "push", "pending", 1)
    assert "shop/prod: pushed #1 to 1 agent(s)." in messages_of(response)


def test_deploy_now_without_an_active_snapshot_says_so_and_pushes_nothing(
        login, tenant_owner, environment, superuser):
    fresh = enrolled_agent(environment, "web-2", actor=superuser).agent

    response = login(tenant_owner).post(AGENTS, {"action": "deploy_now",
                                                 "_selected_action": [fresh.pk]}, follow=True)

    assert response.status_code == 200
    assert not Deployment.objects.exists()
    assert "shop/prod: nothing is active yet." in messages_of(response)


def test_rotating_a_token_shows_the_new_secret_once_and_the_old_one_stops(
        login, tenant_owner, agent):
    old_key = agent.token_key

    response = login(tenant_owner).post(AGENTS, {"action": "rotate_token",
                                                 "_selected_action": [agent.pk]}, follow=True)

    agent.refresh_from_db()
    assert agent.token_key != old_key
    shown = [m for m in messages_of(response) if f"bwa_{agent.token_key}." in m]
    assert len(shown) == 1
    assert AuditEvent.objects.filter(action="agent.token_rotate").count() == 1


def test_releasing_an_operator_pin_from_the_admin(login, tenant_owner, agent, superuser):
    agent_pin(agent=agent, snapshot=Snapshot.objects.get(number=1),
              expected_generation=agent.generation, actor=superuser)

    login(tenant_owner).post(AGENTS, {"action": "release_pin", "_selected_action": [agent.pk]})

    agent.refresh_from_db()
    assert agent.pinned_snapshot is None
    assert AuditEvent.objects.filter(action="agent.pin_release").count() == 1


def test_a_refused_action_reports_the_reason_instead_of_failing(login, tenant_owner, agent):
    # Not pinned: the service refuses, the admin says why (no 500).
    response = login(tenant_owner).post(AGENTS, {"action": "release_pin",
                                                 "_selected_action": [agent.pk]}, follow=True)

    assert response.status_code == 200
    assert messages_of(response) == ["web-1 (shop/prod): web-1 is not pinned."]


def test_a_new_enrollment_token_shows_the_command_to_run(login, tenant_owner, environment):
    response = login(tenant_owner).post(f"{TOKENS}add/", {
        "environment": environment.pk, "name": "racks", "max_uses": 1,
        "expires_in_hours": 2}, follow=True)

    token = EnrollmentToken.objects.get()
    commands = [m for m in messages_of(response) if "bellwether-agent " in m]
    assert len(commands) == 1
    command = commands[0].split(": ", 1)[1]
    assert command.startswith("bellwether-agent --server http://testserver "
                              f"--enrollment-token bwe_{token.key}.")
    assert command.endswith("--name '<agent-name>' --target-dir '/etc/<service>/bellwether'")


def test_decommissioning_from_the_admin_goes_through_the_service(login, tenant_owner,
                                                                 agent):
    client = login(tenant_owner)

    response = client.post(AGENTS, {"action": "decommission", "_selected_action": [agent.pk]},
                           follow=True)

    gone = Agent.objects.get(pk=agent.pk)
    assert gone.decommissioned_at is not None and gone.token_revoked_at is not None
    assert "Decommissioned 1 agent(s)." in messages_of(response)
    assert AuditEvent.objects.filter(action="agent.decommission",
                                     object_id=str(agent.pk)).exists()
    # Listed no more by default; the filter shows it.
    assert listed(client.get(AGENTS)) == []
    assert listed(client.get(AGENTS + "?decommissioned=true")) == [gone]
    assert listed(client.get(AGENTS + "?decommissioned=any")) == [gone]
    # A second time names the state; so does rotating its token.
    again = client.post(AGENTS + "?decommissioned=true", {
        "action": "decommission", "_selected_action": [agent.pk]}, follow=True)
    assert any("web-1 is decommissioned" in m for m in messages_of(again))
    rotated = client.post(AGENTS + "?decommissioned=true", {
        "action": "rotate_token", "_selected_action": [agent.pk]}, follow=True)
    assert any("web-1 is decommissioned" in m for m in messages_of(rotated))
    assert Agent.objects.get(pk=agent.pk).token_revoked_at is not None


def test_an_agents_page_shows_its_last_health_probe(login, tenant_owner, agent):
    agent.last_health = {"ok": False, "attempts": 2, "probe": "url", "output": "HTTP 503"}
    agent.save(update_fields=["last_health"])

    page = login(tenant_owner).get(f"{AGENTS}{agent.pk}/change/").content.decode()

    assert "failed after 2 attempts (url) — HTTP 503" in page


def test_the_agents_list_shows_labels_and_what_holds_each_and_filters_by_it(
        login, tenant_owner, agent, environment, superuser):
    other = enrolled_agent(environment, "web-2", actor=superuser,
                           labels={"zone": "b", "role": "edge"}).agent
    agent_pin(agent=agent, snapshot=Snapshot.objects.get(number=1),
              expected_generation=agent.generation, actor=superuser)
    client = login(tenant_owner)

    page = client.get(AGENTS).content.decode()
    assert "on #1 (operator)" in page and "role=edge, zone=b" in page
    assert listed(client.get(AGENTS + "?held=operator")) == [agent]
    assert listed(client.get(AGENTS + "?held=no")) == [other]
    assert listed(client.get(AGENTS + "?held=rollout")) == []
    assert listed(client.get(AGENTS + f"?environment__id__exact={environment.pk}")) == sorted(
        [agent, other], key=lambda a: a.name)


def test_an_agents_page_lists_its_latest_deployments_newest_first(
        login, tenant_owner, agent, environment, superuser, django_assert_max_num_queries):
    from apps.fleet.admin import DEPLOYMENT_HISTORY
    from apps.releases.services import snapshot_deploy

    first = Snapshot.objects.get(number=1)
    agent.mode = Agent.Mode.MANUAL
    agent.save(update_fields=["mode"])
    for _ in range(DEPLOYMENT_HISTORY + 3):
        snapshot_deploy(snapshot=first, agent_ids=[agent.pk], actor=superuser)
    newest = Deployment.objects.filter(agent=agent).order_by("-created_at")

    page = login(tenant_owner).get(f"{AGENTS}{agent.pk}/change/")
    shown = [form.instance.pk for form in page.context["inline_admin_formsets"][0].formset]
    assert shown == list(newest.values_list("pk", flat=True)[:DEPLOYMENT_HISTORY])
    assert f"Deployments (the last {DEPLOYMENT_HISTORY}, newest first)" in page.content.decode()


def test_an_enrollment_tokens_page_shows_the_command_without_its_secret(
        login, tenant_owner, environment):
    client = login(tenant_owner)
    client.post(f"{TOKENS}add/", {"environment": environment.pk, "name": "racks",
                                  "max_uses": 1, "expires_in_hours": 2}, follow=True)
    token = EnrollmentToken.objects.get()  # its secret was in the messages just shown

    page = client.get(f"{TOKENS}{token.pk}/change/").content.decode()

    assert ("bellwether-agent --server http://testserver --enrollment-token "
            "&#x27;&lt;the enrollment token shown at creation&gt;&#x27;") in page
    assert f"bwe_{token.key}." not in page
