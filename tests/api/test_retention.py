"""Retention over the API: usage against the bounds with what keeps each snapshot,
and an owner's removal of one snapshot, with a reason."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.snapshots.models import Snapshot
from tests import factories
from tests.api.support import ENV, OTHER_ENV
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.fixture
def four(environment, superuser):
    """shop/prod #1..#4, #4 active and #3 the rollback target."""
    return [factories.publish_variant(environment, superuser, workers=10 + i) for i in range(4)]


def numbers(environment) -> list[int]:
    return list(Snapshot.objects.filter(environment=environment).order_by("number")
                .values_list("number", flat=True))


def test_usage_shows_bytes_against_bounds_and_the_holds(four, client_for):
    body = client_for("viewer").get(f"{ENV}/retention").json()
    assert body["snapshots"] == {"count": 4, "bound": 100}
    assert body["bytes"]["stored"] == sum(s["bytes"] for s in body["snapshots_oldest_first"])
    holds = {s["number"]: s["holds"] for s in body["snapshots_oldest_first"]}
    assert holds == {1: [], 2: [], 3: ["rollback_target"], 4: ["active"]}


def test_an_owner_removes_a_snapshot_with_a_reason(four, environment, client_for):
    response = client_for("owner").post(f"{ENV}/snapshots/1/remove", {"reason": "obsolete"},
                                        format="json")
    assert response.status_code == 204, response.content[:300]
    assert numbers(environment) == [2, 3, 4]
    event = AuditEvent.objects.get(action=Action.SNAPSHOT_REMOVE)
    assert event.data["reason"] == "obsolete" and event.actor.username == "owner-user"
    assert_error(client_for("viewer").get(f"{ENV}/snapshots/1"), 404)


@pytest.mark.parametrize("number, codes", [(4, ["active"]), (3, ["rollback_target"])])
def test_removing_a_held_snapshot_is_409_naming_the_holds(four, environment, client_for,
                                                          number, codes):
    error = assert_error(client_for("owner").post(f"{ENV}/snapshots/{number}/remove",
                                                  {"reason": "try"}, format="json"),
                         409, "snapshot_kept")
    assert [d["reason"] for d in error["details"]] == codes
    assert numbers(environment) == [1, 2, 3, 4]


@pytest.mark.parametrize("body, field", [({}, "reason"), ({"reason": ""}, "reason"),
                                         ({"reason": "x" * 501}, "reason"),
                                         ({"reason": ["a"]}, "reason")])
def test_removal_without_a_proper_reason_is_400(four, environment, client_for, body, field):
    error = assert_error(client_for("owner").post(f"{ENV}/snapshots/1/remove", body,
                                                  format="json"), 400)
    assert error["details"][0]["field"] == field
    assert numbers(environment) == [1, 2, 3, 4]


def test_removal_needs_the_owner_role_and_your_own_tenant(four, environment, client_for,
                                                          api_client, outsider, blog):
    body = {"reason": "mine now"}
    assert_error(client_for("deployer").post(f"{ENV}/snapshots/1/remove", body,
                                             format="json"), 403)
    assert_error(api_client(outsider).post(f"{ENV}/snapshots/1/remove", body,
                                           format="json"), 404)
    assert_error(api_client().post(f"{ENV}/snapshots/1/remove", body, format="json"), 401)
    factories.publish(blog, outsider)  # another tenant's snapshot #1
    owner = client_for("owner")
    assert_error(owner.post(f"{OTHER_ENV}/snapshots/1/remove", body, format="json"), 404)
    assert_error(owner.post(f"{ENV}/snapshots/99/remove", body, format="json"), 404)
    assert numbers(environment) == [1, 2, 3, 4] and numbers(blog) == [1]


def test_retention_of_another_tenant_is_404(outsider, client_for):
    assert_error(client_for("owner").get(f"{OTHER_ENV}/retention"), 404, "not_found")
