"""The environment's drift policy: PATCH by owners (a setting, audited as
environment.settings), refused to others and for unknown values."""

import pytest

from apps.audit.models import AuditEvent
from tests.api.support import ENV
from tests.api_helpers import assert_error


def test_an_environment_reports_drift_by_default(environment, owner_client):
    assert owner_client.get(ENV).json()["drift_policy"] == "report"


def test_owner_sets_the_restore_drift_policy_as_an_audited_setting(environment, owner_client):
    response = owner_client.patch(ENV, {"drift_policy": "restore"}, format="json")

    assert response.status_code == 200, response.content
    assert (response.json()["drift_policy"], response.json()["version"]) == ("restore", 2)
    environment.refresh_from_db()
    assert environment.drift_policy == "restore"
    event = AuditEvent.objects.filter(environment=environment).latest("id")
    assert (event.action, event.data["fields"]) == ("environment.settings", ["drift_policy"])


@pytest.mark.parametrize("role", ["viewer", "deployer"])
def test_only_owners_set_the_drift_policy(role, environment, client_for):
    assert_error(client_for(role).patch(ENV, {"drift_policy": "restore"}, format="json"), 403)

    environment.refresh_from_db()
    assert (environment.drift_policy, environment.version) == ("report", 1)


def test_an_outsider_cannot_see_or_set_it(environment, api_client, outsider):
    assert_error(api_client(outsider).patch(ENV, {"drift_policy": "restore"}, format="json"),
                 404)
    environment.refresh_from_db()
    assert environment.drift_policy == "report"


@pytest.mark.parametrize("value", ["ignore", "", "RESTORE", None, 1, ["restore"], "report\x00"])
def test_a_bad_drift_policy_is_400_naming_the_field(value, environment, owner_client):
    response = owner_client.patch(ENV, {"drift_policy": value}, format="json")

    error = assert_error(response, 400)
    assert error["details"][0]["field"] == "drift_policy"
    environment.refresh_from_db()
    assert (environment.drift_policy, environment.version) == ("report", 1)


def test_a_stale_drift_policy_change_is_409(environment, owner_client):
    owner_client.patch(ENV, {"poll_interval_s": 60}, format="json")

    assert_error(owner_client.patch(ENV, {"drift_policy": "restore", "expected_version": 1},
                                    format="json"), 409, "stale")
    environment.refresh_from_db()
    assert environment.drift_policy == "report"
