"""Promotion: what shop/staging runs (its release, a descriptor) applied to shop/prod's
own authoritative config, previewed as a diff against prod's active snapshot and
published through the normal publishing service, its origin recorded."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.environments.services import policy_publish
from apps.releases import services as releases
from apps.snapshots.models import Publication, Snapshot
from tests import factories
from tests.api.support import ENV
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

PROMOTE, PREVIEW = f"{ENV}/promote", f"{ENV}/promotion"
RELEASE = "feature={{ params.feature | default('off') }} region={{ params.region }}\n"


def config(region: str) -> str:
    return factories.CONFIG + f"params:\n  region: {region}\n"


@pytest.fixture
def prod(application, superuser):
    policy_publish(content={"descriptor_policy": {"params": ["feature", "region"]}},
                   actor=superuser)
    env = factories.environment(application, "prod", config=config("us"), actor=superuser,
                                templates={"release.txt": RELEASE})
    factories.publish(env, superuser)
    return env


@pytest.fixture
def staging(prod, application, superuser):
    """shop/staging running #1: release 2.4.0 (feature on) on its own config (region eu)."""
    env = factories.environment(application, "staging", config=config("eu"), actor=superuser,
                                templates={"release.txt": RELEASE})
    descriptor = {"apiVersion": "bellwether/v1", "application": "shop",
                  "environment": "staging", "id": "rel-2.4.0", "version": "2.4.0",
                  "params": {"feature": "on"}}
    publication, _ = releases.descriptor_submit(environment=env, descriptor=descriptor,
                                                actor=superuser)
    assert factories.render(publication).activated
    env.refresh_from_db()
    return env


def test_preview_diffs_prods_active_against_the_release_on_prods_own_config(staging,
                                                                           client_for):
    response = client_for("viewer").get(PREVIEW, {"from": "staging"})

    assert response.status_code == 200, response.content[:300]
    body = response.json()
    assert body["promoted_from"]["environment"] == "shop/staging"
    assert body["promoted_from"]["number"] == 1 and body["against"] == 1 and body["valid"]
    assert [f["path"] for f in body["files"]] == ["release.txt"]
    assert "+feature=on region=us" in body["files"][0]["diff"]
    assert body["provenance"]["params.feature"] == "descriptor promoted from shop/staging #1"
    assert body["provenance"]["params.region"] == "environment"
    assert Publication.objects.filter(environment__name="prod").count() == 1


def test_promote_publishes_through_publishing_and_records_the_origin(staging, prod,
                                                                     client_for):
    response = client_for("deployer").post(PROMOTE, {"from": "staging", "number": 1},
                                           format="json")

    assert response.status_code == 202, response.content[:300]
    publication = factories.render(Publication.objects.get(pk=response.json()["id"]))
    snapshot = publication.snapshot
    assert publication.activated and snapshot.number == 2
    assert snapshot.source["promoted_from"] == {
        "environment": "shop/staging", "number": 1, "label": staging.active_snapshot.label,
        "checksum": staging.active_snapshot.checksum}
    assert snapshot.source["descriptor"]["environment"] == "prod"
    assert snapshot.provenance["params.feature"] == "descriptor promoted from shop/staging #1"
    assert snapshot.files[0]["content"] == "feature=on region=us\n"
    event = AuditEvent.objects.get(action=Action.SNAPSHOT_PROMOTE)
    assert event.environment == prod and event.data["from"] == "shop/staging"


def test_promote_of_a_snapshot_staging_no_longer_runs_is_409_stale(staging, client_for):
    error = assert_error(client_for("deployer").post(PROMOTE, {"from": "staging", "number": 9},
                                                     format="json"), 409, "stale")
    assert error["details"][0]["active"] == 1
    assert not AuditEvent.objects.filter(action=Action.SNAPSHOT_PROMOTE).exists()


def test_promote_needs_the_deployer_role_on_the_target(staging, client_for, api_client,
                                                       outsider):
    body = {"from": "staging"}
    assert_error(client_for("viewer").post(PROMOTE, body, format="json"), 403)
    assert_error(api_client(outsider).post(PROMOTE, body, format="json"), 404)
    assert_error(api_client().post(PROMOTE, body, format="json"), 401)
    assert Publication.objects.filter(environment__name="prod").count() == 1


def test_promote_across_tenants_is_404_for_members_and_400_for_superusers(
        staging, client_for, api_client, superuser, outsider):
    body, owner = {"from": "blog/prod"}, client_for("owner")
    assert_error(owner.post(PROMOTE, body, format="json"), 404, "not_found")
    error = assert_error(api_client(superuser).post(PROMOTE, body, format="json"), 400,
                         "promotion_scope")
    assert error["details"][0]["field"] == "from"
    # And into another tenant's environment: the target itself is not found.
    assert_error(owner.post("/api/v1/environments/blog/prod/promote",
                                          {"from": "shop/staging"}, format="json"), 404)


@pytest.mark.parametrize("body, field", [
    ({}, "from"), ({"from": ""}, "from"), ({"from": "../etc"}, "from"),
    ({"from": "x" * 200}, "from"), ({"from": "staging", "number": -1}, "number"),
    ({"from": "staging", "number": 2**40}, "number"), ({"from": "staging", "confirm": "x"},
                                                       "confirm"),
])
def test_hostile_promote_bodies_are_400_naming_the_field(staging, client_for, body, field):
    error = assert_error(client_for("deployer").post(PROMOTE, body, format="json"), 400)
    assert error["details"][0]["field"] == field
    assert Publication.objects.filter(environment__name="prod").count() == 1


def test_promoting_into_itself_or_from_nothing_running_is_refused(prod, application,
                                                                  superuser, client_for):
    client = client_for("deployer")
    assert_error(client.post(PROMOTE, {"from": "prod"}, format="json"), 400, "promotion_scope")
    factories.environment(application, "empty", config=config("eu"), actor=superuser)
    assert_error(client.post(PROMOTE, {"from": "empty"}, format="json"), 409,
                 "no_active_snapshot")
    assert_error(client.get(PREVIEW), 400)


def test_a_release_that_conflicts_with_prods_config_is_400_merge_conflict(
        prod, application, superuser, client_for):
    env = factories.environment(application, "qa", config=config("eu"), actor=superuser,
                                templates={"release.txt": RELEASE})
    descriptor = {"apiVersion": "bellwether/v1", "application": "shop", "environment": "qa",
                  "id": "rel-eu", "version": "1", "params": {"region": "eu"}}
    factories.render(releases.descriptor_submit(environment=env, descriptor=descriptor,
                                                actor=superuser)[0])

    error = assert_error(client_for("deployer").post(PROMOTE, {"from": "qa"}, format="json"),
                         400, "merge_conflict")

    assert "region" in error["message"] or error["details"]
    assert Snapshot.objects.filter(environment=prod).count() == 1


def test_a_promotion_to_a_governed_direct_prod_is_sent_for_approval(staging, prod, superuser,
                                                                   client_for):
    """Promoted content is published as any publish: in a governed environment with
    the direct policy, stored and held, with a release asking to activate it."""
    from apps.governance.models import ReleaseRequest
    from apps.governance.services import approval_rule_set

    approval_rule_set(environment=prod, actor=superuser, required_approvals=1)
    response = client_for("deployer").post(PROMOTE, {"from": "staging"}, format="json")
    assert response.status_code == 202, response.content[:300]

    publication = factories.render(Publication.objects.get(pk=response.json()["id"]))

    release = ReleaseRequest.objects.get(environment=prod)
    assert publication.activated is False and publication.held["code"] == "approval_required"
    assert (publication.held["details"]["release"], release.snapshot_id) == (
        release.pk, publication.snapshot_id)
