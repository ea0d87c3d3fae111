"""A plan names only agents of its own environment (hostile finding: a release's
rollout plan accepted another environment's agent ids). Every surface that takes a
plan answers 400 unknown_agents naming the field and the ids — a release's plan
(submitted or changed), a rollout's targets and canaries, a push — and writes
nothing: no release, no change of one, no rollout, no pin, no push."""

import pytest

from apps.core.errors import ValidationFailed
from apps.fleet.models import Agent, Deployment
from apps.governance import rules, services
from apps.governance.models import ReleaseRequest
from apps.rollouts import services as rollouts
from apps.rollouts.models import Rollout
from tests import factories
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

ENV = "/api/v1/environments/shop/prod"
NOBODY = 10**12  # no agent at all


@pytest.fixture
def foreign(application, superuser):
    """An agent of shop/staging: the same tenant, another environment."""
    staging = factories.environment(application, "staging", actor=superuser)
    return factories.enrolled_agent(staging, "stage-1", actor=superuser).agent


@pytest.fixture
def mine(environment, superuser):
    return factories.enrolled_agents(environment, 2)


def _generations() -> dict:
    return dict(Agent.objects.values_list("pk", "generation"))


@pytest.mark.parametrize("plan, field", [
    ({"kind": "rollout", "targets": ["{foreign}", "{mine}"], "canary_agents": ["{mine}"]},
     "plan.targets"),
    ({"kind": "rollout", "canary_agents": ["{mine}", "{foreign}"]}, "plan.canary_agents"),
    ({"kind": "push", "agents": ["{foreign}"]}, "plan.agents"),
    ({"kind": "push", "agents": [NOBODY]}, "plan.agents"),
])
def test_a_release_plan_naming_other_agents_is_400_and_writes_nothing(
        plan, field, second, foreign, mine, deployer, two_approvals):
    ids = {"{foreign}": foreign.pk, "{mine}": mine[0].pk}
    plan = {k: [ids.get(i, i) for i in v] if isinstance(v, list) else v
            for k, v in plan.items()}

    response = factories.api_client_for(deployer).post(
        f"{ENV}/releases", {"snapshot": 2, "plan": plan}, format="json")

    error = assert_error(response, 400, "unknown_agents")
    strangers = [i for i in plan.get("targets") or plan.get("agents") or
                 plan["canary_agents"] if i not in (mine[0].pk,)]
    assert error["details"] == [{"field": field, "message": "no agents of shop/prod",
                                 "agents": sorted(strangers)}]
    assert field in error["message"] and str(strangers[0]) in error["message"]
    assert not ReleaseRequest.objects.exists()


def test_changing_a_release_to_a_plan_naming_other_agents_changes_nothing(
        activation, foreign, mine, deployer, alice):
    from tests.governance.conftest import approve

    approve(activation, alice)
    response = factories.api_client_for(deployer).patch(
        f"/api/v1/releases/{activation.pk}",
        {"expected_version": 1, "plan": {"kind": "rollout", "canary_agents": [mine[0].pk],
                                          "targets": [mine[0].pk, foreign.pk]}},
        format="json")

    assert_error(response, 400, "unknown_agents")
    activation.refresh_from_db()
    assert (activation.version, activation.plan) == (1, rules.activation_plan())
    assert activation.approvals.filter(cancelled_at__isnull=True).count() == 1
    assert not activation.editors.exists()


def test_the_service_refuses_them_too(second, environment, foreign, deployer):
    with pytest.raises(ValidationFailed) as raised:
        services.release_submit(environment=environment, snapshot=second, actor=deployer,
                                plan=rules.rollout_plan(canary_agents=[foreign.pk]))
    assert raised.value.details[0]["field"] == "plan.canary_agents"


@pytest.mark.parametrize("field", ["canary_agents", "targets"])
def test_a_rollout_naming_other_agents_is_400_and_pins_nothing(field, second, foreign, mine,
                                                              deployer):
    before = _generations()
    body = {"snapshot": 2, "canary_agents": [mine[0].pk]}
    if field == "canary_agents":
        body["canary_agents"].append(foreign.pk)
    else:
        body["targets"] = [{"agent": a.pk, "expected_generation": g}
                           for a, g in ((mine[0], before[mine[0].pk]), (foreign, 1))]

    response = factories.api_client_for(deployer).post(f"{ENV}/rollouts", body, format="json")

    error = assert_error(response, 400, "unknown_agents")
    assert error["details"][0]["field"] == field
    assert error["details"][0]["agents"] == [foreign.pk]
    assert not Rollout.objects.exists() and _generations() == before


def test_a_rollout_in_a_governed_environment_says_which_agents_before_approvals(
        second, environment, foreign, mine, two_approvals):
    with pytest.raises(ValidationFailed) as raised:
        rollouts.rollout_create(environment=environment, snapshot=second, actor=None,
                                canary_agents=[foreign.pk, NOBODY])
    assert raised.value.details[0]["agents"] == sorted([foreign.pk, NOBODY])


def test_a_push_to_other_agents_is_400_naming_them(first, foreign, mine, deployer):
    response = factories.api_client_for(deployer).post(
        f"{ENV}/snapshots/1/deploy", {"agents": [mine[0].pk, foreign.pk, NOBODY]},
        format="json")
    error = assert_error(response, 400, "unknown_agents")
    assert error["details"][0] == {"field": "agents", "message": "no agents of shop/prod",
                                   "agents": [foreign.pk, NOBODY]}
    assert not Deployment.objects.exists()


def test_the_dashboard_rollout_form_shows_the_refusal_at_the_canaries(second, foreign, mine,
                                                                      deployer):
    before = _generations()
    response = factories.session_client(deployer).post("/e/shop/prod/rollouts/new/", {
        "snapshot": "2", "canary": [str(mine[0].pk), str(foreign.pk)], "waves": "100"})
    assert response.status_code == 400
    assert "no agents of shop/prod" in response.content.decode()
    assert not Rollout.objects.exists() and _generations() == before
