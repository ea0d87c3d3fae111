"""Operator routes of the fleet: agents and their status, modes, tokens, enrollment
tokens, deployments; who may call which."""

import time
from datetime import timedelta

import pytest
from django.core.cache import cache as django_cache
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from apps.fleet import cache as fleet_cache
from apps.fleet.models import Agent, EnrollmentToken
from apps.releases import services as releases
from apps.tenancy.models import ROLE_RANK, Role
from tests import factories
from tests.api_helpers import assert_error, call, route_id
from tests.factories import bearer_client, poll, publish_variant
from tests.fleet.support import AGENTS, ENROLL, ENV, agent_url, deploy_url, report

ROLES = ["viewer", "deployer", "owner"]

# Every fleet operator route, as (method, path, role needed, body, status of a success);
# `{agent}` is an agent of shop/prod, `{env}` an environment's "<application>/<name>".
ROUTES = [
    ("get", "/api/v1/environments/{env}/agents", "viewer", None, 200),
    ("post", "/api/v1/environments/{env}/enrollment-tokens", "owner", {"uses": 2}, 201),
    ("post", "/api/v1/environments/{env}/snapshots/1/deploy", "deployer", {"agents": []}, 201),
    ("post", "/api/v1/environments/{env}/snapshots/1/activate", "deployer", None, 200),
    ("get", "/api/v1/agents/{agent}", "viewer", None, 200),
    ("patch", "/api/v1/agents/{agent}", "deployer", {"mode": "manual"}, 200),
    ("get", "/api/v1/agents/{agent}/deployments", "viewer", None, 200),
    ("post", "/api/v1/agents/{agent}/token/rotate", "owner", None, 200),
    ("post", "/api/v1/agents/{agent}/token/revoke", "owner", None, 200),
    ("post", "/api/v1/agents/{agent}/decommission", "owner", {"expected_generation": 1}, 200),
]


@pytest.fixture
def fleet(enroll, first):
    """shop/prod with snapshot #1 active and one auto_pull agent."""
    return enroll("web-1")


@pytest.fixture
def url(fleet):
    def make(path: str, env: str = "shop/prod") -> str:
        return path.format(env=env, agent=fleet.agent.pk)

    return make


# -- who may call which -------------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
@pytest.mark.parametrize("role", ROLES)
def test_role_below_the_one_a_route_needs_gets_403_and_at_or_above_succeeds(
    route, role, url, client_for, request
):
    method, path, required, body, status = route

    response = call(client_for(role), method, url(path), body)

    if ROLE_RANK[Role(role)] < ROLE_RANK[Role(required)]:
        error = assert_error(response, 403, "permission_denied")
        assert required in error["message"]
    else:
        assert response.status_code == status, (response.status_code, response.content[:300])


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
@pytest.mark.parametrize("who", ["superuser", "environment-owner"])
def test_superusers_and_environment_owners_may_use_every_route(
    route, who, url, api_client, superuser, make_user, environment, request
):
    method, path, _, body, status = route
    user = superuser
    if who == "environment-owner":
        user = make_user("env-owner")  # a viewer of the tenant who owns shop/prod
        factories.membership(environment.application.tenant, user, "viewer", actor=superuser)
        environment.owners.add(user)

    response = call(api_client(user), method, url(path), body)

    assert response.status_code == status, (response.status_code, response.content[:300])


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_outsider_gets_404(route, url, api_client, outsider, fleet):
    method, path, _, body, _ = route
    before = Agent.objects.values().get(pk=fleet.agent.pk)

    response = call(api_client(outsider), method, url(path), body)

    assert_error(response, 404, "not_found")
    assert Agent.objects.values().get(pk=fleet.agent.pk) == before


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_anonymous_gets_401_with_a_bearer_challenge(route, url):
    method, path, _, body, _ = route

    response = call(APIClient(), method, url(path), body)

    assert_error(response, 401, "not_authenticated")
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("route", ROUTES, ids=route_id)
def test_agent_token_is_refused_on_operator_routes(route, url, fleet):
    method, path, _, body, _ = route

    response = call(fleet.client, method, url(path), body)

    assert_error(response, 401)


@pytest.mark.parametrize("suffix", ["", "/deployments", "/token/rotate", "/token/revoke",
                                    "/decommission"])
def test_unknown_agent_is_404(suffix, api_client, superuser, fleet):
    method = "get" if suffix in ("", "/deployments") else "post"

    response = getattr(api_client(superuser), method)(agent_url(999_999, suffix))

    assert_error(response, 404, "not_found")


def test_agent_list_of_another_tenants_environment_is_404(client_for, fleet, outsider):
    response = client_for("owner").get("/api/v1/environments/blog/prod/agents")

    assert_error(response, 404, "not_found")


# -- the agents list and status -----------------------------------------------------------


STATUS_FIELDS = {"last_seen_at", "online", "desired", "applied", "sync", "last_status",
                 "last_message", "last_report_at", "last_health", "blocked", "pinned", "held_by",
                 "drift"}


def test_agents_list_shows_each_agents_status(client_for, enroll, first):
    synced, failing, _idle = enroll("web-1"), enroll("web-2"), enroll("web-3", mode="manual")
    report(synced.client, first)
    report(failing.client, first, status="failed", message="nginx -t failed")
    poll(synced.client)

    response = client_for("viewer").get(AGENTS)

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 3
    rows = {row["name"]: row for row in body["results"]}
    assert list(rows) == ["web-1", "web-2", "web-3"]
    assert set(rows["web-1"]) == {"id", "name", "environment", "labels", "enabled", "mode",
                                  "generation", "created_at", "decommissioned_at", "status"}
    assert all(set(row["status"]) == STATUS_FIELDS for row in rows.values())
    one, two, three = (rows[n]["status"] for n in ("web-1", "web-2", "web-3"))
    desired = {"number": 1, "checksum": first.checksum}
    assert (one["online"], one["sync"], one["desired"], one["applied"], one["blocked"]) == (
        True, "in_sync", desired, desired, None)
    assert (two["online"], two["sync"], two["last_status"], two["last_message"],
            two["blocked"]) == (False, "never_applied", "failed", "nginx -t failed", desired)
    assert (three["last_seen_at"], three["last_status"], three["applied"]) == (
        None, None, None)
    assert rows["web-3"]["mode"] == "manual"
    assert three["desired"] == desired


def test_agent_is_offline_after_three_poll_intervals_without_heartbeat(client_for, enroll,
                                                                       first):
    recent, stale = enroll("web-1"), enroll("web-2")
    now = time.time()  # shop/prod polls every 30 s: offline after 90 s
    django_cache.set(fleet_cache._seen_key(recent.agent.pk), now - 80)
    django_cache.set(fleet_cache._seen_key(stale.agent.pk), now - 100)

    rows = {row["name"]: row["status"] for row in
            client_for("viewer").get(AGENTS).json()["results"]}

    assert (rows["web-1"]["online"], rows["web-2"]["online"]) == (True, False)
    assert rows["web-2"]["last_seen_at"] is not None


def test_flushed_last_seen_counts_when_the_cache_forgot(client_for, enroll, first):
    agent = enroll()
    Agent.objects.filter(pk=agent.agent.pk).update(
        last_seen_at=timezone.now() - timedelta(seconds=100))

    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]

    assert status["online"] is False
    assert status["last_seen_at"] is not None


def test_agent_behind_its_desired_snapshot_shows_behind(client_for, enroll, first,
                                                        environment, superuser):
    agent = enroll()
    report(agent.client, first)
    publish_variant(environment, superuser, workers=8)

    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]

    assert status["sync"] == "behind"
    assert (status["desired"]["number"], status["applied"]["number"]) == (2, 1)


def test_agents_list_runs_the_same_queries_for_one_or_many_agents(client_for, enroll,
                                                                   first, superuser):
    viewer = client_for("viewer")
    viewer.get(AGENTS)  # its token's first use is written (then at most once a minute)
    agent = enroll("web-0")
    report(agent.client, first)
    with CaptureQueriesContext(connection) as one:
        assert viewer.get(AGENTS).json()["count"] == 1
    for i in range(1, 6):
        more = enroll(f"web-{i}", mode="manual" if i % 2 else "auto_pull")
        report(more.client, first)
        poll(more.client)
    releases.snapshot_deploy(snapshot=first, agent_ids=[], actor=superuser)

    with CaptureQueriesContext(connection) as many:
        assert viewer.get(AGENTS).json()["count"] == 6

    assert len(many) == len(one), [q["sql"] for q in many]


def test_agents_list_only_shows_the_environments_agents(client_for, enroll, first, blog):
    enroll("web-1")
    enroll("web-1", env=blog)

    body = client_for("viewer").get(AGENTS).json()

    assert [(r["name"], r["environment"]) for r in body["results"]] == [("web-1", "shop/prod")]


# -- agent detail and PATCH ---------------------------------------------------------------


def test_agent_detail_shows_the_agent(client_for, fleet):
    response = client_for("viewer").get(agent_url(fleet.agent.pk))

    assert response.status_code == 200
    body = response.json()
    assert (body["id"], body["name"], body["environment"], body["mode"], body["enabled"]) == (
        fleet.agent.pk, "web-1", "shop/prod", "auto_pull", True)
    assert set(body["status"]) == STATUS_FIELDS


def test_patch_changes_mode_enabled_and_labels(client_for, fleet):
    response = client_for("deployer").patch(
        agent_url(fleet.agent.pk),
        {"mode": "manual", "enabled": False, "labels": {"zone": "b"}}, format="json")

    assert response.status_code == 200
    assert (response.json()["mode"], response.json()["enabled"], response.json()["labels"]) == (
        "manual", False, {"zone": "b"})
    agent = fleet.fresh()
    assert (agent.mode, agent.enabled, agent.labels) == ("manual", False, {"zone": "b"})


@pytest.mark.parametrize("body", [{"mode": "push"}, {"mode": None}, {"enabled": "maybe"},
                                  {"labels": ["a"]}, {"labels": {"": "x"}}])
def test_patch_with_bad_values_is_400(body, client_for, fleet):
    before = Agent.objects.values().get(pk=fleet.agent.pk)

    response = client_for("deployer").patch(agent_url(fleet.agent.pk), body, format="json")

    assert_error(response, 400)
    assert Agent.objects.values().get(pk=fleet.agent.pk) == before


def test_patch_by_a_viewer_is_403_and_changes_nothing(client_for, fleet):
    response = client_for("viewer").patch(agent_url(fleet.agent.pk), {"mode": "manual"},
                                          format="json")

    assert_error(response, 403, "permission_denied")
    assert fleet.fresh().mode == "auto_pull"


# -- tokens -------------------------------------------------------------------------------


def test_rotate_returns_a_new_working_token_and_the_old_one_fails(client_for, fleet):
    old = fleet.client

    response = client_for("owner").post(agent_url(fleet.agent.pk, "/token/rotate"))

    assert response.status_code == 200
    token = response.json()["token"]
    assert token.startswith("bwa_") and token != fleet.token
    assert poll(bearer_client(token)).status_code == 200
    assert_error(poll(old), 401, "authentication_failed")


def test_rotate_after_revoke_gives_a_working_token(client_for, fleet):
    owner = client_for("owner")
    owner.post(agent_url(fleet.agent.pk, "/token/revoke"))

    token = owner.post(agent_url(fleet.agent.pk, "/token/rotate")).json()["token"]

    assert poll(bearer_client(token)).status_code == 200


def test_revoke_refuses_the_token(client_for, fleet):
    response = client_for("owner").post(agent_url(fleet.agent.pk, "/token/revoke"))

    assert response.status_code == 200
    assert response.json()["id"] == fleet.agent.pk
    assert fleet.fresh().token_revoked_at is not None
    assert_error(poll(fleet.client), 401, "authentication_failed")


@pytest.mark.parametrize("action", ["rotate", "revoke"])
def test_token_actions_by_a_deployer_are_403(action, client_for, fleet):
    response = client_for("deployer").post(agent_url(fleet.agent.pk, f"/token/{action}"))

    assert_error(response, 403, "permission_denied")
    assert poll(fleet.client).status_code == 200


# -- enrollment tokens --------------------------------------------------------------------


def test_owner_creates_an_enrollment_token_that_enrolls(client_for, environment):
    response = client_for("owner").post(f"{ENV}/enrollment-tokens",
                                        {"uses": 2, "expires_in_s": 600, "name": "rack 4"},
                                        format="json")

    assert response.status_code == 201
    body = response.json()
    assert set(body) == {"key", "token", "uses", "expires_at", "command"}
    assert body["uses"] == 2 and body["token"].startswith(f"bwe_{body['key']}.")
    assert body["command"] == (
        f"bellwether-agent --server http://testserver --enrollment-token {body['token']} "
        "--name '<agent-name>' --target-dir '/etc/<service>/bellwether'")
    row = EnrollmentToken.objects.get(key=body["key"])
    assert (row.max_uses, row.uses, row.name, row.environment_id) == (
        2, 0, "rack 4", environment.pk)
    assert timedelta(seconds=590) < row.expires_at - timezone.now() <= timedelta(seconds=600)
    enrolled = APIClient().post(ENROLL, {"enrollment_token": body["token"], "name": "web-1"},
                                format="json")
    assert enrolled.status_code == 201


@pytest.mark.parametrize("body", [{"uses": 0}, {"uses": -1}, {"uses": "many"},
                                  {"expires_in_s": 10}, {"expires_in_s": 400 * 86400}])
def test_enrollment_token_with_bad_values_is_400(body, client_for, environment):
    response = client_for("owner").post(f"{ENV}/enrollment-tokens", body, format="json")

    assert_error(response, 400)
    assert not EnrollmentToken.objects.exists()


def test_enrollment_token_by_a_deployer_is_403(client_for, environment):
    response = client_for("deployer").post(f"{ENV}/enrollment-tokens", {}, format="json")

    assert_error(response, 403, "permission_denied")
    assert not EnrollmentToken.objects.exists()


# -- deployments --------------------------------------------------------------------------


def test_agent_deployments_lists_pushes_and_pulls_newest_first(client_for, enroll, first,
                                                               superuser):
    agent, other = enroll("web-1"), enroll("web-2")
    report(agent.client, first, status="failed", message="x")
    [pushed] = releases.snapshot_deploy(snapshot=first, agent_ids=[agent.agent.pk],
                                        actor=superuser)
    report(other.client, first)

    response = client_for("viewer").get(agent_url(agent.agent.pk, "/deployments"))

    assert response.status_code == 200
    rows = response.json()["results"]
    assert [(r["kind"], r["state"], r["snapshot"], r["agent"]) for r in rows] == [
        ("push", "pending", 1, agent.agent.pk), ("pull", "failed", 1, agent.agent.pk)]
    assert rows[0]["id"] == str(pushed.pk)


def test_deploy_response_lists_the_deployments(client_for, fleet):
    response = client_for("deployer").post(deploy_url(1), {"agents": [fleet.agent.pk]},
                                           format="json")

    assert response.status_code == 201
    [row] = response.json()
    assert (row["agent"], row["snapshot"], row["state"], row["reported_at"]) == (
        fleet.agent.pk, 1, "pending", None)


def test_failed_apply_of_a_newer_snapshot_shows_failed_and_blocked(client_for, enroll, first,
                                                                   environment, superuser):
    agent = enroll()
    report(agent.client, first)
    second = publish_variant(environment, superuser, workers=8)
    report(agent.client, second, status="failed", message="nginx -t failed")

    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]

    assert status["sync"] == "failed"
    assert status["applied"] == {"number": 1, "checksum": first.checksum}
    assert status["blocked"] == {"number": 2, "checksum": second.checksum}
