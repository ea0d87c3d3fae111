"""Fixtures for the admin tests: staff users by relationship to shop/prod, a logged-in
client, and published snapshots."""

import pytest

from apps.environments.services import environment_set_owners
from tests import factories


@pytest.fixture
def staff_member(tenant, superuser):
    """staff_member("owner") -> a staff user with that role in shop-team."""

    def make(role: str, username: str | None = None):
        return factories.member(tenant, role, username=username or f"staff-{role}",
                                is_staff=True, actor=superuser)

    return make


@pytest.fixture
def tenant_owner(staff_member):
    return staff_member("owner")


@pytest.fixture
def environment_owner(make_user, environment, tenant, superuser):
    """A staff user who owns shop/prod through Environment.owners, a viewer of its
    tenant otherwise (owners count only while members)."""
    user = make_user("env-owner", is_staff=True)
    factories.membership(tenant, user, "viewer", actor=superuser)
    environment_set_owners(environment=environment, owners=[user], actor=superuser)
    return user


@pytest.fixture
def staff_outsider(outsider):
    """The outsider (owner of tenant 'other' and blog/prod), with admin access."""
    outsider.is_staff = True
    outsider.save(update_fields=["is_staff"])
    return outsider


@pytest.fixture
def login(client):
    """login(user) -> the test client with `user`'s admin session."""

    def as_user(user):
        client.force_login(user)
        return client

    return as_user


@pytest.fixture
def snapshots(environment, superuser):
    """shop/prod with two ready snapshots: #1 (workers 4) and #2 (workers 8)."""
    first = factories.publish(environment, superuser)
    second = factories.publish_variant(environment, superuser, workers=8)
    assert (first.number, first.state, second.number, second.state) == (1, "ready", 2, "ready")
    return first, second
