"""Who may do what: roles viewer < deployer < owner; outsiders never learn what exists."""

import uuid

import pytest

from apps.tenancy.models import ROLE_RANK, Role
from tests import factories
from tests.api.support import ENV_ROUTES, ROUTES
from tests.api_helpers import assert_error, call_undone, route_id

ROLES = ["viewer", "deployer", "owner"]


@pytest.mark.parametrize("role", ROLES)
def test_role_below_the_one_a_route_needs_gets_403_and_at_or_above_succeeds(
    role, route_url, client_for, subtests
):
    client = client_for(role)
    for route in ROUTES:
        method, path, required, body, status = route
        with subtests.test(route_id(route)):
            response = call_undone(client, method, route_url(path), body)

            if ROLE_RANK[Role(role)] < ROLE_RANK[Role(required)]:
                error = assert_error(response, 403, "permission_denied")
                assert required in error["message"]
            else:
                assert response.status_code == status, (response.status_code,
                                                         response.content[:300])


@pytest.mark.parametrize("who", ["superuser", "environment-owner"])
def test_superusers_and_environment_owners_may_use_every_route(
    who, route_url, api_client, superuser, make_user, environment, subtests
):
    if who == "superuser":
        user = superuser
    else:  # owns shop/prod while a viewer of its tenant
        user = make_user("env-owner")
        factories.membership(environment.application.tenant, user, "viewer", actor=superuser)
        environment.owners.add(user)
    client = api_client(user)

    for route in ROUTES:
        method, path, _, body, status = route
        with subtests.test(route_id(route)):
            response = call_undone(client, method, route_url(path), body)

            assert response.status_code == status, (response.status_code,
                                                     response.content[:300])


def test_outsider_gets_the_same_404_for_a_foreign_environment_as_for_a_missing_one(
    route_url, api_client, outsider, subtests
):
    client = api_client(outsider)
    for route in ENV_ROUTES:
        method, path, _, body, _ = route
        with subtests.test(route_id(route)):
            foreign = call_undone(client, method, route_url(path, env="shop/prod"), body)
            missing = call_undone(client, method, route_url(path, env="nosuch/prod"), body)

            foreign_error = assert_error(foreign, 404, "not_found")
            missing_error = assert_error(missing, 404, "not_found")
            assert foreign_error["message"] == missing_error["message"].replace("nosuch",
                                                                                "shop")


def test_member_of_one_tenant_gets_404_for_another_tenants_environment(route_url, client_for,
                                                                       subtests):
    client = client_for("owner")
    for route in ENV_ROUTES:
        method, path, _, body, _ = route
        with subtests.test(route_id(route)):
            response = call_undone(client, method, route_url(path, env="blog/prod"), body)

            assert_error(response, 404, "not_found")


def test_outsider_gets_404_for_a_publication_of_a_foreign_environment(route_url, api_client,
                                                                       outsider):
    response = api_client(outsider).get(route_url("/api/v1/publications/{publication}"))

    assert_error(response, 404, "not_found")


def test_outsider_gets_404_not_403_for_a_route_needing_a_higher_role(api_client, outsider,
                                                                     snapshots):
    # A viewer-level outsider must not learn from a 403 that shop/prod exists.
    response = api_client(outsider).patch("/api/v1/environments/shop/prod",
                                          {"poll_interval_s": 60}, format="json")

    assert_error(response, 404, "not_found")
    snapshots[0].environment.refresh_from_db()
    assert snapshots[0].environment.poll_interval_s == 30


def test_user_without_any_membership_sees_nothing(make_user, api_client, environment):
    client = api_client(make_user("nobody"))

    listing = client.get("/api/v1/environments")
    detail = client.get("/api/v1/environments/shop/prod")

    assert listing.status_code == 200
    assert listing.json()["results"] == []
    assert_error(detail, 404, "not_found")


def test_random_publication_id_is_404(api_client, superuser):
    response = api_client(superuser).get(f"/api/v1/publications/{uuid.uuid4()}")

    assert_error(response, 404, "not_found")
