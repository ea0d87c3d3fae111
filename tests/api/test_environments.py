"""GET /environments, GET and PATCH /environments/<app>/<env>."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.services import environment_create
from apps.tenancy.services import application_create
from tests.api.support import ENV
from tests.api_helpers import assert_error

BROKEN_YAML = "listen: 80\nserver_name: shop.example.com\nupstreams: [10.0.0.1,\nworkers: 4\n"


# -- list ---------------------------------------------------------------------------------


def test_list_shows_only_environments_the_user_may_see(environment, outsider, api_client,
                                                       member, superuser):
    member_names = [
        e["full_name"]
        for e in api_client(member("viewer")).get("/api/v1/environments").json()["results"]
    ]
    outsider_names = [
        e["full_name"] for e in api_client(outsider).get("/api/v1/environments").json()["results"]
    ]
    superuser_names = [
        e["full_name"]
        for e in api_client(superuser).get("/api/v1/environments").json()["results"]
    ]

    assert member_names == ["shop/prod"]
    assert outsider_names == ["blog/prod"]
    assert superuser_names == ["blog/prod", "shop/prod"]


def test_list_leaves_out_environments_the_user_owns_outside_its_tenants(environment, outsider,
                                                                        api_client):
    environment.owners.add(outsider)  # an ownership counts only while a member

    response = api_client(outsider).get("/api/v1/environments")

    assert [e["full_name"] for e in response.json()["results"]] == ["blog/prod"]
    assert api_client(outsider).get(ENV).status_code == 404


def test_list_shows_an_environment_once_to_a_member_who_also_owns_it(environment, member,
                                                                    api_client):
    user = member("viewer")
    environment.owners.add(user)

    body = api_client(user).get("/api/v1/environments").json()

    assert body["count"] == 1
    assert [e["full_name"] for e in body["results"]] == ["shop/prod"]


def test_list_items_describe_each_environment(environment, api_client, member):
    response = api_client(member("viewer")).get("/api/v1/environments")

    assert response.status_code == 200
    (item,) = response.json()["results"]
    assert item["application"] == "shop"
    assert item["name"] == "prod"
    assert item["tenant"] == "shop-team"
    assert item["poll_interval_s"] == 30
    assert item["snapshot_counter"] == 0
    assert item["url"] == "/api/v1/environments/shop/prod"
    assert "config" not in item


def test_list_is_paginated(application, superuser, api_client):
    for name in ("a-env", "b-env", "c-env"):
        environment_create(application=application, name=name, config="a: 1\n",
                           actor=superuser)

    first = api_client(superuser).get("/api/v1/environments?limit=2").json()
    second = api_client(superuser).get("/api/v1/environments?limit=2&offset=2").json()

    assert first["count"] == 3
    assert [e["name"] for e in first["results"]] == ["a-env", "b-env"]
    assert "offset=2" in first["next"]
    assert [e["name"] for e in second["results"]] == ["c-env"]
    assert second["next"] is None


def test_list_query_count_does_not_grow_with_the_number_of_environments(
    tenant, superuser, member, api_client, django_assert_num_queries
):
    client = api_client(member("viewer"))
    client.get("/api/v1/environments")  # settles the token's last_used_at write

    def create_environments(first: int, last: int):
        for index in range(first, last):
            app = application_create(tenant=tenant, name=f"app-{index}", actor=superuser)
            environment_create(application=app, name="prod", config="a: 1\n",
                               actor=superuser)

    create_environments(0, 2)
    with django_assert_num_queries(3):  # token, count, page joined to application and tenant
        assert client.get("/api/v1/environments").json()["count"] == 2
    create_environments(2, 6)
    with django_assert_num_queries(3):
        assert client.get("/api/v1/environments").json()["count"] == 6


def test_list_refuses_anonymous_clients(api_client, environment):
    response = api_client().get("/api/v1/environments")

    assert_error(response, 401, "not_authenticated")


# -- detail -------------------------------------------------------------------------------


def test_detail_shows_config_templates_fallback_files_and_the_callers_role(
    environment, fallback_file, api_client, member
):
    response = api_client(member("deployer")).get(ENV)

    assert response.status_code == 200
    body = response.json()
    assert body["full_name"] == "shop/prod"
    assert body["config"] == environment.config
    assert body["config_schema"] is None
    assert [t["path"] for t in body["templates"]] == ["nginx/shop.conf", "shop/app.json"]
    assert "server_name {{ server_name }};" in body["templates"][0]["source"]
    assert body["fallback_files"] == [
        {"path": "www/index.html", "content": "<p>maintenance</p>\n"}
    ]
    assert body["role"] == "deployer"


def test_detail_reports_owner_role_for_environment_owners_and_superusers(
    environment, api_client, member, superuser
):
    env_owner = member("viewer", "env-owner")
    environment.owners.add(env_owner)

    assert api_client(env_owner).get(ENV).json()["role"] == "owner"
    assert api_client(superuser).get(ENV).json()["role"] == "owner"


def test_detail_of_missing_environment_is_404(environment, owner_client):
    for path in ("/api/v1/environments/shop/staging", "/api/v1/environments/nosuch/prod"):
        assert_error(owner_client.get(path), 404, "not_found")


# -- PATCH ------------------------------------------------------------------------------------


def test_owner_changes_config_and_poll_interval_and_it_is_audited(environment, owner_client):
    config = environment.config.replace("workers: 4", "workers: 8")

    response = owner_client.patch(ENV, {"config": config, "poll_interval_s": 120},
                                  format="json")

    assert response.status_code == 200
    assert response.json()["config"] == config
    assert response.json()["poll_interval_s"] == 120
    environment.refresh_from_db()
    assert (environment.config, environment.poll_interval_s) == (config, 120)
    # What snapshots render from and the settings are audited apart: only the
    # first waits in pending changes.
    events = AuditEvent.objects.filter(environment=environment).order_by("-id")[:2]
    assert [(e.action, e.actor_name, e.data["fields"]) for e in events] == [
        ("environment.settings", "owner-user", ["poll_interval_s"]),
        ("environment.update", "owner-user", ["config"]),
    ]


def test_owner_keeps_rollout_pins_as_an_audited_setting(environment, owner_client):
    response = owner_client.patch(ENV, {"keep_rollout_pins": True}, format="json")

    assert response.status_code == 200
    assert response.json()["keep_rollout_pins"] is True
    environment.refresh_from_db()
    assert environment.keep_rollout_pins is True
    event = AuditEvent.objects.filter(environment=environment).latest("id")
    assert (event.action, event.data["fields"]) == ("environment.settings",
                                                   ["keep_rollout_pins"])


def test_keep_rollout_pins_must_be_a_boolean(environment, owner_client):
    assert_error(owner_client.patch(ENV, {"keep_rollout_pins": "sometimes"}, format="json"),
                 400)


def test_patch_without_a_change_records_no_audit_event(environment, owner_client):
    before = AuditEvent.objects.count()

    response = owner_client.patch(ENV, {"poll_interval_s": 30}, format="json")

    assert response.status_code == 200
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize("role", ["viewer", "deployer"])
def test_patch_needs_the_owner_role(role, environment, client_for):
    response = client_for(role).patch(ENV, {"poll_interval_s": 60}, format="json")

    error = assert_error(response, 403, "permission_denied")
    assert "owner" in error["message"]
    environment.refresh_from_db()
    assert environment.poll_interval_s == 30


def test_patch_with_broken_yaml_is_400_naming_the_line(environment, owner_client):
    response = owner_client.patch(ENV, {"config": BROKEN_YAML}, format="json")

    error = assert_error(response, 400, "config_invalid")
    (problem,) = error["details"]
    assert problem["code"] == "yaml_syntax"
    assert problem["file"] == "config"
    assert problem["line"] == 5
    assert "config:5" in error["message"]
    environment.refresh_from_db()
    assert "workers: 4" in environment.config and "[10.0.0.1," not in environment.config


@pytest.mark.parametrize(
    ("config", "code", "line"),
    [
        ("- just\n- a list\n", "config_not_mapping", 1),
        ("a: 1\nb: 2\na: 3\n", "yaml_syntax", 3),
        ("a: !!python/object:os.system x\n", "yaml_syntax", 1),
        ("a: [1\n", "yaml_syntax", 2),
        ("ok: 1\n\tbad: tab\n", "yaml_syntax", 2),
    ],
)
def test_patch_refuses_config_that_is_not_a_yaml_mapping(config, code, line, environment,
                                                         owner_client):
    response = owner_client.patch(ENV, {"config": config}, format="json")

    error = assert_error(response, 400, "config_invalid")
    assert error["details"][0]["code"] == code
    assert error["details"][0]["line"] == line
    assert f"config:{line}" in error["message"]


@pytest.mark.parametrize("mode", ['"0644"', '"0660"', '"0200"', "0640"])
def test_patch_refuses_a_secret_file_mode_exposing_secrets_naming_the_key(
        mode, environment, owner_client):
    before = environment.config
    response = owner_client.patch(ENV, {"config": f"a: 1\nsecret_file_mode: {mode}\n"},
                                  format="json")

    error = assert_error(response, 400, "config_invalid")
    assert (error["details"][0]["code"], error["details"][0]["key"]) == (
        "secret_file_mode", "secret_file_mode")
    assert "secret_file_mode" in error["message"]
    environment.refresh_from_db()
    assert environment.config == before


def test_patch_takes_a_secret_file_mode_the_group_may_read(environment, owner_client):
    response = owner_client.patch(ENV, {"config": 'a: 1\nsecret_file_mode: "0640"\n'},
                                  format="json")

    assert response.status_code == 200, response.content
    environment.refresh_from_db()
    assert "secret_file_mode" in environment.config


@pytest.mark.parametrize("config", [{"a": 1}, ["a"], None])
def test_patch_refuses_config_that_is_not_a_string(config, environment, owner_client):
    response = owner_client.patch(ENV, {"config": config}, format="json")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "config"


def test_patch_accepts_an_empty_config(environment, owner_client):
    response = owner_client.patch(ENV, {"config": ""}, format="json")

    assert response.status_code == 200
    assert response.json()["config"] == ""


@pytest.mark.parametrize("value", [4, 3601, 0, -30, "often", None, 10.5])
def test_patch_refuses_poll_interval_out_of_range(value, environment, owner_client):
    response = owner_client.patch(ENV, {"poll_interval_s": value}, format="json")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "poll_interval_s"
    environment.refresh_from_db()
    assert environment.poll_interval_s == 30


@pytest.mark.parametrize("value", [5, 3600])
def test_patch_accepts_poll_interval_at_the_bounds(value, environment, owner_client):
    response = owner_client.patch(ENV, {"poll_interval_s": value}, format="json")

    assert response.status_code == 200
    assert response.json()["poll_interval_s"] == value


@pytest.mark.parametrize("schema", [[1, 2], "object", 7, True])
def test_patch_refuses_config_schema_that_is_not_an_object(schema, environment, owner_client):
    response = owner_client.patch(ENV, {"config_schema": schema}, format="json")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "config_schema"
    environment.refresh_from_db()
    assert environment.config_schema is None


def test_patch_sets_and_clears_config_schema(environment, owner_client):
    schema = {"type": "object", "required": ["listen"]}

    set_response = owner_client.patch(ENV, {"config_schema": schema}, format="json")
    clear_response = owner_client.patch(ENV, {"config_schema": None}, format="json")

    assert set_response.status_code == 200
    assert set_response.json()["config_schema"] == schema
    assert clear_response.status_code == 200
    assert clear_response.json()["config_schema"] is None
