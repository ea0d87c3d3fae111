"""Who sees what in the admin: owners of an environment, and nobody else."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.models import Snapshot
from tests.admin.support import (
    AUDIT_EVENTS,
    ENVIRONMENTS,
    SNAPSHOTS,
    change_url,
    environment_form,
    listed,
)
from tests.factories import publish


@pytest.mark.parametrize("owner_fixture", ["tenant_owner", "environment_owner"])
def test_staff_owner_sees_the_environment_and_opens_its_change_page(
        request, owner_fixture, login, environment):
    client = login(request.getfixturevalue(owner_fixture))

    assert listed(client.get(ENVIRONMENTS)) == [environment]
    response = client.get(change_url(ENVIRONMENTS, environment.pk))
    assert response.status_code == 200
    assert response.context["original"] == environment
    assert "server_name: shop.example.com" in response.content.decode()


@pytest.mark.parametrize("role", ["deployer", "viewer"])
def test_staff_deployer_or_viewer_neither_lists_nor_opens_the_environment(
        role, staff_member, login, environment):
    client = login(staff_member(role))

    assert listed(client.get(ENVIRONMENTS)) == []
    response = client.get(change_url(ENVIRONMENTS, environment.pk))
    # Django's answer for an object outside the queryset: back to the index, with a message.
    assert response.status_code == 302
    assert response["Location"] == "/admin/"


def test_staff_outsider_sees_only_their_own_environment(staff_outsider, login, environment):
    client = login(staff_outsider)

    assert [e.full_name for e in listed(client.get(ENVIRONMENTS))] == ["blog/prod"]
    response = client.get(change_url(ENVIRONMENTS, environment.pk))
    assert response.status_code == 302
    assert response["Location"] == "/admin/"


@pytest.mark.parametrize("role", ["deployer", "viewer"])
def test_post_to_the_change_page_of_an_unowned_environment_changes_nothing(
        role, staff_member, login, environment):
    client = login(staff_member(role))
    before = AuditEvent.objects.count()

    response = client.post(change_url(ENVIRONMENTS, environment.pk),
                           environment_form(environment, config="hijacked: true"))

    assert response.status_code == 302
    environment.refresh_from_db()
    assert "hijacked" not in environment.config
    assert AuditEvent.objects.count() == before


def test_environment_changelist_does_not_name_other_tenants_in_its_filter(
        staff_outsider, login, environment):
    """The tenant filter lists tenants; an outsider must not learn 'Shop team' from it."""
    response = login(staff_outsider).get(ENVIRONMENTS)

    assert response.status_code == 200
    content = response.content.decode()
    assert "Shop team" not in content
    assert f"application__tenant__id__exact={environment.application.tenant_id}" not in content


def test_snapshot_changelist_does_not_name_other_tenants_applications_in_its_filter(
        staff_outsider, login, environment, superuser):
    publish(environment, superuser)
    blog = Environment.objects.get(application__name="blog")
    publish(blog, superuser)

    response = login(staff_outsider).get(SNAPSHOTS)

    assert [s.environment.full_name for s in listed(response)] == ["blog/prod"]
    content = response.content.decode()
    assert f"environment__application__id__exact={environment.application_id}" not in content


@pytest.mark.parametrize("path", ["/admin/", ENVIRONMENTS, SNAPSHOTS, AUDIT_EVENTS])
def test_non_staff_user_cannot_reach_the_admin(path, member, login, environment):
    """Even a tenant owner needs is_staff to use the admin."""
    client = login(member("owner"))

    response = client.get(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")


def test_snapshots_of_unowned_environments_are_hidden(
        staff_member, staff_outsider, tenant_owner, login, environment, superuser):
    snapshot = publish(environment, superuser)
    blog = Environment.objects.get(application__name="blog")
    blog_snapshot = publish(blog, superuser)

    assert listed(login(tenant_owner).get(SNAPSHOTS)) == [snapshot]
    assert listed(login(staff_member("deployer")).get(SNAPSHOTS)) == []
    client = login(staff_outsider)
    assert listed(client.get(SNAPSHOTS)) == [blog_snapshot]
    response = client.get(change_url(SNAPSHOTS, snapshot.pk))
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert Snapshot.objects.count() == 2


def test_audit_events_of_unowned_environments_are_hidden(
        staff_member, staff_outsider, tenant_owner, login, environment):
    shop_events = set(AuditEvent.objects.filter(environment=environment))
    assert {e.action for e in shop_events} >= {"environment.create", "template.create"}

    owner_sees = set(listed(login(tenant_owner).get(AUDIT_EVENTS)))
    assert shop_events <= owner_sees

    deployer_sees = listed(login(staff_member("deployer")).get(AUDIT_EVENTS))
    assert deployer_sees == []

    client = login(staff_outsider)
    outsider_sees = listed(client.get(AUDIT_EVENTS))
    assert outsider_sees, "the outsider sees the events of their own tenant"
    assert all(e.tenant.slug == "other" for e in outsider_sees)
    assert not shop_events & set(outsider_sees)
    response = client.get(change_url(AUDIT_EVENTS, next(iter(shop_events)).pk))
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
