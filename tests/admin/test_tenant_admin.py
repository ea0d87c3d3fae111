"""The tenant page manages memberships through the inline, via the services."""

import pytest

from apps.audit.models import AuditEvent
from apps.tenancy.models import Membership
from tests.admin.support import TENANTS, change_url, listed


def tenant_form(tenant, rows: list[dict]) -> dict:
    """POST data for the tenant change page; `rows` are membership rows (existing
    ones carry their id and come first). The inline prefix is the related name."""
    existing = [row for row in rows if row.get("id")]
    data = {
        "name": tenant.name,
        "memberships-TOTAL_FORMS": str(len(rows)),
        "memberships-INITIAL_FORMS": str(len(existing)),
        "memberships-MIN_NUM_FORMS": "0",
        "memberships-MAX_NUM_FORMS": "1000",
        "_save": "Save",
    }
    for index, row in enumerate(existing + [row for row in rows if not row.get("id")]):
        prefix = f"memberships-{index}"
        data[f"{prefix}-id"] = str(row.get("id") or "")
        data[f"{prefix}-tenant"] = str(tenant.pk)
        data[f"{prefix}-username"] = row["user"].get_username()
        data[f"{prefix}-role"] = row["role"]
        if row.get("DELETE"):
            data[f"{prefix}-DELETE"] = "on"
    return data


def membership_rows(tenant) -> list[dict]:
    return [{"id": m.pk, "user": m.user, "role": m.role}
            for m in tenant.memberships.select_related("user").order_by("pk")]


@pytest.mark.parametrize("actor_fixture", ["superuser", "tenant_owner"])
def test_membership_inline_adds_a_member_with_a_role(
        request, actor_fixture, login, tenant, make_user):
    actor = request.getfixturevalue(actor_fixture)
    dana = make_user("dana")
    rows = membership_rows(tenant) + [{"user": dana, "role": "deployer"}]

    response = login(actor).post(change_url(TENANTS, tenant.pk), tenant_form(tenant, rows))

    assert response.status_code == 302, response.context and response.context["errors"]
    assert Membership.objects.get(tenant=tenant, user=dana).role == "deployer"
    event = AuditEvent.objects.get(action="membership.set", data__user="dana")
    assert (event.actor, event.tenant, event.data) == (
        actor, tenant, {"user": "dana", "role": "deployer"})


def test_membership_inline_changes_a_role(login, superuser, tenant, member):
    viewer = member("viewer")
    rows = membership_rows(tenant)
    rows[0]["role"] = "owner"

    response = login(superuser).post(change_url(TENANTS, tenant.pk), tenant_form(tenant, rows))

    assert response.status_code == 302
    assert Membership.objects.get(tenant=tenant, user=viewer).role == "owner"
    assert AuditEvent.objects.filter(action="membership.set", data__user="viewer",
                                     data__role="owner").count() == 1


def test_membership_inline_removes_a_member(login, superuser, tenant, member):
    deployer = member("deployer")
    rows = membership_rows(tenant)
    rows[0]["DELETE"] = True

    response = login(superuser).post(change_url(TENANTS, tenant.pk), tenant_form(tenant, rows))

    assert response.status_code == 302
    assert not Membership.objects.filter(tenant=tenant, user=deployer).exists()
    assert AuditEvent.objects.filter(action="membership.remove", tenant=tenant).count() == 1


def test_tenant_deployer_cannot_open_or_change_the_tenant(
        login, staff_member, tenant, make_user):
    client = login(staff_member("deployer"))
    intruder = make_user("intruder")

    assert listed(client.get(TENANTS)) == []
    response = client.post(change_url(TENANTS, tenant.pk),
                           tenant_form(tenant, [{"user": intruder, "role": "owner"}]))

    assert response.status_code == 302
    assert not Membership.objects.filter(user=intruder).exists()
    assert not AuditEvent.objects.filter(action="membership.set", data__user="intruder").exists()


def test_a_tenant_owner_adds_a_member_by_username_without_a_user_list(
        login, tenant_owner, tenant, make_user):
    make_user("erin")
    client = login(tenant_owner)

    page = client.get(change_url(TENANTS, tenant.pk))
    assert b"erin" not in page.content  # no list of every user on the page
    response = client.post(change_url(TENANTS, tenant.pk), tenant_form(
        tenant, membership_rows(tenant) + [{"user": make_user("frank"), "role": "viewer"}]))

    assert response.status_code == 302
    assert tenant.memberships.filter(user__username="frank", role="viewer").exists()


def test_an_unknown_username_is_a_form_error(login, tenant_owner, tenant):
    client = login(tenant_owner)
    data = tenant_form(tenant, membership_rows(tenant))
    index = int(data["memberships-TOTAL_FORMS"])
    data.update({"memberships-TOTAL_FORMS": str(index + 1),
                 f"memberships-{index}-username": "nobody",
                 f"memberships-{index}-role": "viewer"})

    response = client.post(change_url(TENANTS, tenant.pk), data)

    assert response.status_code == 200
    assert b"No active user named" in response.content
