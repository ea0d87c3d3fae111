"""Platform policy versions and tenant restrictions in the admin."""

import json

from apps.audit.models import AuditEvent
from apps.environments.models import PlatformPolicy
from apps.tenancy.services import tenant_update
from tests.admin.support import TENANTS, change_url
from tests.admin.test_tenant_admin import membership_rows, tenant_form

POLICIES = "/admin/environments/platformpolicy/"
POLICY = {"descriptor_policy": {"params": ["replicas"], "secret_refs": [], "rollback": True}}


def test_a_superuser_publishes_policy_versions(login, superuser):
    client = login(superuser)
    for replicas in ("replicas", "workers"):
        content = {"descriptor_policy": {**POLICY["descriptor_policy"], "params": [replicas]}}
        response = client.post(f"{POLICIES}add/", {"content": json.dumps(content)})
        assert response.status_code == 302

    versions = list(PlatformPolicy.objects.order_by("version").values_list("version", "content"))
    assert [v for v, _ in versions] == [1, 2]
    assert versions[1][1]["descriptor_policy"]["params"] == ["workers"]
    assert AuditEvent.objects.filter(action="policy.publish").count() == 2


def test_a_policy_without_descriptor_policy_mapping_is_a_form_error(login, superuser):
    response = login(superuser).post(f"{POLICIES}add/", {
        "content": json.dumps({"descriptor_policy": ["not", "a", "mapping"]})})

    assert response.status_code == 200
    assert not PlatformPolicy.objects.exists()


def test_staff_who_are_not_superusers_cannot_publish_a_policy(login, tenant_owner):
    response = login(tenant_owner).post(f"{POLICIES}add/", {"content": json.dumps(POLICY)})

    assert response.status_code == 403
    assert not PlatformPolicy.objects.exists()


def test_a_superuser_sets_tenant_restrictions(login, superuser, tenant):
    data = tenant_form(tenant, membership_rows(tenant))
    data["restrictions"] = json.dumps({"secret_refs": ["vault:secret/data/{application}/*"]})

    response = login(superuser).post(change_url(TENANTS, tenant.pk), data)

    assert response.status_code == 302
    tenant.refresh_from_db()
    assert tenant.restrictions == {"secret_refs": ["vault:secret/data/{application}/*"]}


def test_a_tenant_owner_cannot_change_the_tenants_restrictions(login, tenant_owner, tenant,
                                                               superuser):
    narrowed = {"secret_refs": ["env:SHOP_*"]}
    tenant_update(tenant=tenant, restrictions=narrowed, actor=superuser)
    data = tenant_form(tenant, membership_rows(tenant))
    data["restrictions"] = json.dumps({})  # an attempt to widen back to the policy

    login(tenant_owner).post(change_url(TENANTS, tenant.pk), data)

    tenant.refresh_from_db()
    assert tenant.restrictions == narrowed
    page = login(tenant_owner).get(change_url(TENANTS, tenant.pk)).content.decode()
    assert 'name="restrictions"' not in page
