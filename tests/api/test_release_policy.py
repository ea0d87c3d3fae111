"""The environment resource: its release policy (PATCH with expected_version, owners
only) and what is live (active snapshot, active rollout), with pinned query counts."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.services import environment_create, environment_file_put
from apps.releases.services import environment_update
from apps.rollouts.services import rollout_rollback
from apps.tenancy.services import application_create
from tests.api.support import ENV
from tests.api_helpers import assert_error
from tests.factories import enrolled_agents, publish, publish_variant, start_rollout


def test_an_environment_is_direct_by_default_with_a_version(environment, owner_client):
    body = owner_client.get(ENV).json()

    assert (body["release_policy"], body["version"]) == ("direct", 1)
    assert body["active_snapshot"] is None and body["active_rollout"] is None


def test_owner_makes_it_staged_at_the_version_read_and_it_is_a_setting(environment,
                                                                       owner_client):
    version = owner_client.get(ENV).json()["version"]

    response = owner_client.patch(ENV, {"release_policy": "staged",
                                        "expected_version": version}, format="json")

    assert response.status_code == 200, response.content
    assert (response.json()["release_policy"], response.json()["version"]) == (
        "staged", version + 1)
    environment.refresh_from_db()
    assert environment.is_staged
    event = AuditEvent.objects.filter(environment=environment).latest("id")
    assert (event.action, event.data["fields"]) == ("environment.settings",
                                                   ["release_policy"])


@pytest.mark.parametrize("value", ["manual", "", "STAGED", None, 1, ["staged"]])
def test_a_bad_release_policy_is_400_naming_the_field(value, environment, owner_client):
    response = owner_client.patch(ENV, {"release_policy": value, "expected_version": 1},
                                  format="json")

    error = assert_error(response, 400)
    assert error["details"][0]["field"] == "release_policy"
    environment.refresh_from_db()
    assert (environment.release_policy, environment.version) == ("direct", 1)


def test_changing_the_release_policy_needs_expected_version(environment, owner_client):
    error = assert_error(owner_client.patch(ENV, {"release_policy": "staged"}, format="json"),
                         400)

    assert error["details"][0]["field"] == "expected_version"


@pytest.mark.parametrize("version", [0, -1, "x", 2**40])
def test_a_malformed_expected_version_is_400(version, environment, owner_client):
    response = owner_client.patch(ENV, {"release_policy": "staged",
                                        "expected_version": version}, format="json")

    assert assert_error(response, 400)["details"][0]["field"] == "expected_version"


def test_a_stale_expected_version_is_409_and_changes_nothing(environment, owner_client,
                                                             superuser):
    environment_update(environment=environment, actor=superuser, poll_interval_s=60)

    response = owner_client.patch(ENV, {"release_policy": "staged", "expected_version": 1},
                                  format="json")

    error = assert_error(response, 409, "stale")
    assert "version 2, not 1" in error["message"]
    environment.refresh_from_db()
    assert environment.release_policy == "direct"


def test_expected_version_guards_any_other_change_too(environment, owner_client, superuser):
    environment_update(environment=environment, actor=superuser, poll_interval_s=60)

    assert_error(owner_client.patch(ENV, {"poll_interval_s": 90, "expected_version": 1},
                                     format="json"), 409, "stale")
    assert owner_client.patch(ENV, {"poll_interval_s": 90, "expected_version": 2},
                              format="json").status_code == 200


@pytest.mark.parametrize("role", ["viewer", "deployer"])
def test_only_owners_change_the_release_policy(role, environment, client_for):
    response = client_for(role).patch(ENV, {"release_policy": "staged",
                                            "expected_version": 1}, format="json")

    assert_error(response, 403, "permission_denied")
    environment.refresh_from_db()
    assert environment.release_policy == "direct"


def test_the_environment_carries_its_active_snapshot_and_rollout(environment, first,
                                                                 superuser, client_for):
    environment_update(environment=environment, actor=superuser, release_policy="staged")
    second = publish_variant(environment, superuser, workers=8)
    web1, _ = enrolled_agents(environment, 2)
    rollout = start_rollout(environment, second, [web1])
    viewer = client_for("viewer")

    detail = viewer.get(ENV).json()
    (item,) = viewer.get("/api/v1/environments").json()["results"]

    for body in (detail, item):
        assert body["release_policy"] == "staged"
        assert body["active_snapshot"] == {"number": 1, "label": first.label,
                                           "checksum": first.checksum}
        assert body["active_rollout"] == {"id": rollout.pk, "state": "running",
                                          "current_wave": 0, "snapshot": 2,
                                          "url": f"/api/v1/rollouts/{rollout.pk}"}


def test_a_finished_rollout_is_no_longer_the_active_one(environment, first, superuser,
                                                        client_for):
    environment_update(environment=environment, actor=superuser, release_policy="staged")
    second = publish_variant(environment, superuser, workers=8)
    (web1,) = enrolled_agents(environment, 1)
    rollout = start_rollout(environment, second, [web1])
    rollout_rollback(rollout=rollout, expected_version=rollout.version, actor=superuser)

    body = client_for("viewer").get(ENV).json()

    assert body["active_rollout"] is None
    assert body["active_snapshot"]["number"] == 3  # the rollback's re-rendered #1


def _environments_with_rollouts(tenant, superuser, first: int, last: int):
    for index in range(first, last):
        app = application_create(tenant=tenant, name=f"app-{index}", actor=superuser)
        env = environment_create(application=app, name="prod", actor=superuser,
                                 release_policy="staged",
                                 config="listen: 80\nworkers: 4\n")
        one = publish(env, superuser)
        env.refresh_from_db()
        env = environment_update(environment=env, actor=superuser,
                                 config="listen: 80\nworkers: 8\n")
        two = publish(env, superuser)
        assert one.number == 1
        (agent,) = enrolled_agents(env, 1, prefix=f"a{index}")
        start_rollout(env, two, [agent])


def test_list_query_count_does_not_grow_with_live_environments(
        tenant, superuser, member, api_client, django_assert_num_queries):
    client = api_client(member("viewer"))
    client.get("/api/v1/environments")  # settles the token's last_used_at write

    _environments_with_rollouts(tenant, superuser, 0, 2)
    with django_assert_num_queries(3):  # token, count, the page with what is live
        assert client.get("/api/v1/environments").json()["count"] == 2
    _environments_with_rollouts(tenant, superuser, 2, 5)
    with django_assert_num_queries(3):
        body = client.get("/api/v1/environments").json()
    assert body["count"] == 5
    assert all(item["active_rollout"] for item in body["results"])


@pytest.mark.parametrize("templates", [1, 6])
def test_detail_query_count_does_not_grow_with_templates(
        templates, environment, first, superuser, client_for, django_assert_num_queries):
    for index in range(templates):
        environment_file_put(environment=environment, kind="template", path=f"t/{index}.txt",
                             text="x", actor=superuser)
    client = client_for("viewer")
    client.get(ENV)  # settles the token's last_used_at write

    # token; the environment seen and the role it is read with (owners, membership);
    # the environment with what is live; templates; fallback files; the role shown
    # (owners, membership)
    with django_assert_num_queries(9):
        assert client.get(ENV).status_code == 200
