"""Named rollout strategies: definitions checked field by field, the built-in ones
(seeded, read-only), a tenant's own, an environment's default, and rollouts started
from a strategy with fields overriding it — through the services and every route,
each with a positive and a negative case."""

import re

import pytest
from rest_framework.test import APIClient

from apps.audit.models import Action, AuditEvent
from apps.rollouts.models import EnvironmentStrategy, Rollout, RolloutStrategy
from apps.rollouts.strategy_rules import rollout_options, strategy_problems
from cli.main import build_parser
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

STRATEGIES = "/api/v1/strategies"
DEFAULT = "/api/v1/environments/shop/prod/default-strategy"
ROLLOUTS = "/api/v1/environments/shop/prod/rollouts"
GOOD = {"canary": {"count": 1}, "canary_gate": "auto", "bake_s": 60,
        "waves": [{"percent": 50, "max_in_flight": 2, "max_failures": 1},
                  {"percent": 100, "gate": "manual"}]}


# --- the rules, pure ---------------------------------------------------------------------


def test_every_builtin_strategy_is_a_good_definition():
    builtins = RolloutStrategy.objects.filter(tenant__isnull=True)
    assert {s.name for s in builtins} >= {"canary-then-10-percent", "linear-20-percent",
                                          "all-at-once"}
    assert all(strategy_problems(s.definition) == [] for s in builtins)
    assert strategy_problems(GOOD) == []


@pytest.mark.parametrize("definition, field", [
    ({"waves": [{"percent": 0}]}, "waves[0].percent"),
    ({"waves": [{"percent": 101}]}, "waves[0].percent"),
    ({"waves": [{"percent": 50}, {"percent": 20}]}, "waves[1].percent"),
    ({"waves": [{"count": 0}]}, "waves[0].count"),
    ({"waves": [{"count": 10_001}]}, "waves[0].count"),
    ({"waves": [{"percent": 10, "count": 2}]}, "waves[0]"),
    ({"waves": [{"percent": 10, "bake_s": -1}]}, "waves[0].bake_s"),
    ({"waves": [{"percent": 10, "max_in_flight": 0}]}, "waves[0].max_in_flight"),
    ({"waves": [{"percent": 10, "max_failures": True}]}, "waves[0].max_failures"),
    ({"waves": [{"percent": 10, "gate": "maybe"}]}, "waves[0].gate"),
    ({"waves": [{"percent": 10, "speed": 1}]}, "waves[0].speed"),
    ({"waves": []}, "waves"),
    ({"bake_s": -5}, "bake_s"),
    ({"bake_s": "10"}, "bake_s"),
    ({"wave_timeout_s": 59}, "wave_timeout_s"),
    ({"failure_threshold": -1}, "failure_threshold"),
    ({"canary": {"percent": 0}}, "canary.percent"),
    ({"canary": {"agents": [1]}}, "canary.agents"),
    ({"canary_gate": "later"}, "canary_gate"),
    ({"colour": "blue"}, "colour"),
    ([1, 2], ""),
])
def test_a_bad_definition_names_its_field(definition, field):
    assert field in [p["field"] for p in strategy_problems(definition)]


def test_fields_a_request_sets_override_the_strategy():
    options = rollout_options(GOOD, {"bake_s": 5, "canary_agents": [3], "waves": None})
    assert options["bake_s"] == 5
    assert options["waves"] == GOOD["waves"]
    assert "canary_count" not in options  # named canaries replace the strategy's count
    assert options["wave_timeout_s"] == 3600  # neither said: the default


# --- /strategies ----------------------------------------------------------------------------


@pytest.fixture
def owner(client_for):
    return client_for("owner")


@pytest.fixture
def deployer(client_for):
    return client_for("deployer")


@pytest.fixture
def stranger(outsider, api_client):
    return api_client(outsider)


def _create(client, name="gentle", definition=GOOD, tenant="shop-team"):
    return client.post(STRATEGIES, {"tenant": tenant, "name": name, "definition": definition,
                                    "description": "two waves"}, format="json")


def test_a_tenant_owner_creates_a_strategy_audited(owner):
    response = _create(owner)
    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["name"], body["tenant"], body["builtin"]) == ("gentle", "shop-team", False)
    assert AuditEvent.objects.filter(action=Action.STRATEGY_CREATE,
                                     object_id=str(body["id"])).exists()


def test_a_bad_definition_is_400_naming_the_field_and_writes_nothing(owner):
    error = assert_error(_create(owner, definition={"waves": [{"percent": 150}]}), 400)
    assert error["details"][0]["field"] == "definition.waves[0].percent"
    assert not RolloutStrategy.objects.filter(tenant__isnull=False).exists()


def test_a_bad_name_is_400(owner):
    error = assert_error(_create(owner, name="Not A Slug"), 400)
    assert error["details"][0]["field"] == "name"


def test_a_deployer_may_not_create_a_strategy(deployer):
    assert_error(_create(deployer), 403, "permission_denied")


def test_another_tenant_is_404_for_a_stranger(stranger):
    assert_error(_create(stranger), 404)


def test_a_name_taken_is_409(owner):
    assert _create(owner).status_code == 201
    assert_error(_create(owner), 409, "strategy_exists")
    assert_error(_create(owner, name="all-at-once"), 409, "strategy_exists")


def test_the_list_holds_builtins_and_own_strategies_only(owner, stranger):
    assert _create(owner).status_code == 201
    mine = {s["name"] for s in owner.get(STRATEGIES).json()["results"]}
    theirs = {s["name"] for s in stranger.get(STRATEGIES).json()["results"]}
    assert {"gentle", "all-at-once"} <= mine
    assert "all-at-once" in theirs and "gentle" not in theirs
    assert_error(APIClient().get(STRATEGIES), 401)


def test_detail_and_delete(owner, stranger):
    strategy_id = _create(owner).json()["id"]
    assert owner.get(f"{STRATEGIES}/{strategy_id}").json()["name"] == "gentle"
    assert_error(stranger.get(f"{STRATEGIES}/{strategy_id}"), 404)
    assert_error(stranger.delete(f"{STRATEGIES}/{strategy_id}"), 404)
    assert owner.delete(f"{STRATEGIES}/{strategy_id}").status_code == 204
    assert AuditEvent.objects.filter(action=Action.STRATEGY_DELETE).exists()
    assert_error(owner.get(f"{STRATEGIES}/{strategy_id}"), 404)


def test_a_builtin_strategy_is_read_only(owner):
    builtin = RolloutStrategy.objects.get(tenant__isnull=True, name="all-at-once")
    assert owner.get(f"{STRATEGIES}/{builtin.pk}").json()["builtin"] is True
    assert_error(owner.delete(f"{STRATEGIES}/{builtin.pk}"), 403, "read_only")
    assert RolloutStrategy.objects.filter(pk=builtin.pk).exists()


def test_a_default_strategy_cannot_be_deleted(owner, environment):
    strategy_id = _create(owner).json()["id"]
    assert owner.put(DEFAULT, {"strategy": "gentle"}, format="json").status_code == 200
    assert_error(owner.delete(f"{STRATEGIES}/{strategy_id}"), 409, "strategy_in_use")


# --- /environments/<app>/<env>/default-strategy -------------------------------------------


def test_an_owner_sets_reads_and_clears_the_default(owner, deployer, environment):
    assert owner.get(DEFAULT).json()["strategy"] is None
    response = owner.put(DEFAULT, {"strategy": "linear-20-percent"}, format="json")
    assert response.status_code == 200, response.content
    assert deployer.get(DEFAULT).json()["strategy"]["name"] == "linear-20-percent"
    assert AuditEvent.objects.filter(action=Action.STRATEGY_DEFAULT,
                                     environment=environment).count() == 1
    assert owner.delete(DEFAULT).status_code == 204
    assert not EnvironmentStrategy.objects.exists()


def test_setting_the_default_needs_an_owner_and_a_known_strategy(owner, deployer, stranger,
                                                                 environment):
    assert_error(deployer.put(DEFAULT, {"strategy": "all-at-once"}, format="json"), 403)
    assert_error(stranger.put(DEFAULT, {"strategy": "all-at-once"}, format="json"), 404)
    error = assert_error(owner.put(DEFAULT, {"strategy": "nope"}, format="json"), 400,
                         "unknown_strategy")
    assert [detail["field"] for detail in error["details"]] == ["strategy"]
    assert_error(owner.put(DEFAULT, {}, format="json"), 400)
    assert_error(deployer.delete(DEFAULT), 403)
    assert not EnvironmentStrategy.objects.exists()


def test_another_tenants_strategy_cannot_be_a_default(owner, outsider, api_client,
                                                      environment):
    assert _create(api_client(outsider), name="theirs", tenant="other").status_code == 201
    error = assert_error(owner.put(DEFAULT, {"strategy": "theirs"}, format="json"), 400,
                         "unknown_strategy")
    assert "theirs" not in error["details"][0]["choices"]  # never another tenant's names


# --- rollouts from a strategy ----------------------------------------------------------------


@pytest.fixture
def nodes(fleet, second):
    return fleet(5)


def test_a_rollout_takes_its_named_strategy(deployer, nodes):
    response = deployer.post(ROLLOUTS, {"snapshot": 2, "strategy": "all-at-once"},
                             format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["strategy"] == "all-at-once"
    assert [(w["size"], w["gate"], w["activated"]) for w in body["waves"]] == [(5, "auto", 5)]


def test_fields_override_the_strategy_one_by_one(deployer, nodes):
    response = deployer.post(ROLLOUTS, {"snapshot": 2, "strategy": "canary-then-10-percent",
                                        "bake_s": 5, "canary_agents": [nodes[4].pk]},
                             format="json")
    assert response.status_code == 201, response.content
    waves = response.json()["waves"]
    assert waves[0]["bake_s"] == 5 and waves[1]["bake_s"] == 600
    assert [t["name"] for t in response.json()["targets"] if t["wave"] == 0] == ["web-5"]


def test_the_environment_default_applies_when_none_is_named(owner, deployer, nodes):
    owner.put(DEFAULT, {"strategy": "canary-then-10-percent"}, format="json")
    body = deployer.post(ROLLOUTS, {"snapshot": 2}, format="json").json()
    assert body["strategy"] == "canary-then-10-percent"
    assert [w["size"] for w in body["waves"]] == [1, 1, 3]
    assert [t["name"] for t in body["targets"] if t["wave"] == 0] == ["web-1"]


def test_an_unknown_strategy_is_400_naming_the_field_and_the_strategies_there_are(
        deployer, nodes):
    error = assert_error(deployer.post(ROLLOUTS, {"snapshot": 2, "strategy": "nope"},
                                       format="json"), 400, "unknown_strategy")
    builtin = ["all-at-once", "canary-then-10-percent", "careful", "linear-20-percent"]
    assert error["details"] == [{"field": "strategy", "message": "no strategy named 'nope'",
                                 "choices": builtin}]
    assert error["message"] == f"strategy: no strategy named 'nope'; shop/prod may use " \
                               f"{', '.join(builtin)}."
    assert not Rollout.objects.exists()


def test_without_a_strategy_or_canaries_a_rollout_is_refused(deployer, nodes):
    assert_error(deployer.post(ROLLOUTS, {"snapshot": 2}, format="json"), 400, "no_canaries")


@pytest.mark.django_db
def test_the_clis_help_names_only_strategies_there_are():
    parser = build_parser()
    helped = parser._subparsers._group_actions[0].choices["rollout"]
    text = helped._subparsers._group_actions[0].choices["start"].format_help()
    named = re.findall(r"--strategy ([a-z0-9-]+)", text)

    assert named
    assert set(named) <= set(RolloutStrategy.objects.filter(tenant__isnull=True)
                             .values_list("name", flat=True))
