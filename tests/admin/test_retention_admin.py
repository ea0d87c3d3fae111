"""The admin shows each environment's stored bytes against its retention bounds, and
saves the bounds and the shrink threshold through the services."""

import pytest

from apps.audit.models import Action, AuditEvent
from tests import factories
from tests.admin.support import ENVIRONMENTS, change_url, environment_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def owner_client(login, tenant_owner):
    return login(tenant_owner)


def test_the_list_and_the_page_show_stored_bytes_against_the_bounds(
        owner_client, environment, superuser):
    factories.publish(environment, superuser)
    factories.publish_variant(environment, superuser, workers=8)

    listing = owner_client.get(ENVIRONMENTS).content.decode()
    page = owner_client.get(change_url(ENVIRONMENTS, environment.pk)).content.decode()

    assert "of 1.0\xa0GB; 2 of 100 snapshots" in listing
    assert "2 of 100 snapshots; 0 of 100 finished rollouts" in page
    assert "stored of 1.0\xa0GB" in page


def test_bounds_are_saved_and_audited_as_settings(owner_client, environment):
    data = environment_form(environment, retention_snapshots="7", retention_bytes=str(1 << 21),
                            retention_rollouts="4", shrink_threshold_percent="25")

    response = owner_client.post(change_url(ENVIRONMENTS, environment.pk), data)

    assert response.status_code == 302, response.context and response.context["errors"]
    environment.refresh_from_db()
    assert (environment.retention_snapshots, environment.retention_bytes,
            environment.retention_rollouts, environment.shrink_threshold_percent) == (
        7, 1 << 21, 4, 25)
    event = AuditEvent.objects.filter(action=Action.ENVIRONMENT_SETTINGS).latest("id")
    assert set(event.data["fields"]) == {"retention_snapshots", "retention_bytes",
                                         "retention_rollouts", "shrink_threshold_percent"}


@pytest.mark.parametrize("field, value", [("retention_snapshots", "-3"),
                                          ("retention_bytes", str(2**62)),
                                          ("shrink_threshold_percent", "150")])
def test_out_of_range_bounds_are_refused_on_the_form(owner_client, environment, field, value):
    before = environment.version
    response = owner_client.post(change_url(ENVIRONMENTS, environment.pk),
                                 environment_form(environment, **{field: value}))
    assert response.status_code == 200
    environment.refresh_from_db()
    assert environment.version == before
