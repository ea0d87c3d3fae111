"""Outside a tenant every role is an outsider: an environment owner removed from the
tenant owns nothing there any more, on every surface."""

import pytest
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.environments.selectors import environment_role, owner_candidates
from apps.environments.services import environment_set_owners
from apps.tenancy.models import Membership
from tests import factories
from tests.admin.support import ENVIRONMENTS, TENANTS, change_url
from tests.admin.test_tenant_admin import membership_rows, tenant_form

ENV = "/api/v1/environments/shop/prod"


@pytest.fixture
def olga(tenant, superuser):
    """The tenant's owner, with admin access."""
    return factories.member(tenant, "owner", username="olga", is_staff=True, actor=superuser)


@pytest.fixture
def vic(tenant, environment, olga):
    """A viewer of the tenant whom olga made an owner of shop/prod."""
    user = factories.member(tenant, "viewer", username="vic", is_staff=True, actor=olga)
    environment_set_owners(environment=environment, owners=[user], actor=olga)
    assert environment_role(user=user, environment=environment) == "owner"
    return user


def remove_in_the_admin(client, olga, tenant, user):
    rows = membership_rows(tenant)
    for row in rows:
        row["DELETE"] = row["user"] == user
    client.force_login(olga)
    response = client.post(change_url(TENANTS, tenant.pk), tenant_form(tenant, rows))
    assert response.status_code == 302, response.context and response.context["errors"]


def assert_an_outsider_everywhere(user, environment, api_client, client):
    api = api_client(user)
    assert api.get("/api/v1/environments").json()["results"] == []
    assert api.get(ENV).status_code == 404
    assert api.patch(ENV, {"poll_interval_s": 60}, format="json").status_code == 404
    assert api.post(f"{ENV}/enrollment-tokens", {"uses": 1}, format="json").status_code == 404
    assert environment_role(user=user, environment=environment) is None
    assert not Environment.objects.visible_to(user).exists()
    assert not Environment.objects.owned_by(user).exists()
    client.force_login(user)
    page = reverse("dashboard:environment", args=["shop", "prod"])
    assert client.get(page).status_code == 404
    assert client.get(change_url(ENVIRONMENTS, environment.pk)).status_code in (302, 404)
    listed = client.get(ENVIRONMENTS)
    assert listed.status_code == 403 or not list(listed.context["cl"].result_list)
    environment.refresh_from_db()
    assert environment.poll_interval_s == 30


def test_a_member_removed_in_the_admin_loses_the_environments_they_owned(
        client, api_client, tenant, environment, olga, vic):
    since = AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first()

    remove_in_the_admin(client, olga, tenant, vic)

    assert not Membership.objects.filter(tenant=tenant, user=vic).exists()
    assert not environment.owners.exists()
    events = AuditEvent.objects.filter(pk__gt=since).order_by("pk")
    dropped = events.get(action="environment.owners")
    assert (dropped.actor, dropped.environment_id, dropped.data) == (
        olga, environment.pk, {"owners": []})
    assert "vic left Shop team" in dropped.summary
    assert events.filter(action="membership.remove").count() == 1
    assert_an_outsider_everywhere(vic, environment, api_client, client)


def test_an_ownership_left_behind_counts_for_nothing_outside_the_tenant(
        client, api_client, tenant, environment, vic):
    # As if the membership were removed by a path that forgot the ownership.
    Membership.objects.filter(tenant=tenant, user=vic).delete()
    assert environment.owners.filter(pk=vic.pk).exists()

    assert_an_outsider_everywhere(vic, environment, api_client, client)


def test_a_user_who_is_no_member_cannot_be_made_an_owner(
        tenant, environment, olga, make_user):
    stranger = make_user("stranger")

    with pytest.raises(Exception, match="stranger must be members of Shop team"):
        environment_set_owners(environment=environment, owners=[stranger], actor=olga)

    assert not environment.owners.exists()
    assert stranger not in owner_candidates(user=olga, environment=environment)


def test_a_superusers_owner_choices_are_the_tenants_members_too(
        superuser, environment, vic, outsider):
    candidates = set(owner_candidates(user=superuser, environment=environment))

    assert vic in candidates
    assert outsider not in candidates


def test_a_member_who_stays_keeps_the_ownership_and_its_owner_role(
        client, api_client, tenant, environment, olga, vic, member):
    other = member("deployer")

    remove_in_the_admin(client, olga, tenant, other)

    assert environment_role(user=vic, environment=environment) == "owner"
    response = api_client(vic).patch(ENV, {"poll_interval_s": 60}, format="json")
    assert response.status_code == 200, response.content
