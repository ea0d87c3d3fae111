"""The degenerate-render guard: a publish that empties a file that had content, or
shrinks the files past the environment's threshold, is stored and held (409
confirmation_required naming the files and the shrink) until someone confirms;
`confirm: true` accepts it up front. Also the bounded settings it and retention use."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.environments.services import environment_file_put
from apps.releases import services as releases
from apps.snapshots.models import Publication
from tests import factories
from tests.api.support import ENV
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db


def empty_site(environment, actor):
    """Empty the nginx site's template (an empty JSON file would be invalid)."""
    environment_file_put(environment=environment, kind="template", path="nginx/shop.conf",
                         text="", actor=actor)


def publish_via_api(client, body=None):
    """POST publish (202: rendering on commit), then the render as the worker does."""
    response = client.post(f"{ENV}/publish", body or {}, format="json")
    assert response.status_code == 202, response.content[:300]
    return factories.render(Publication.objects.get(pk=response.json()["id"]))


def test_an_emptied_file_holds_the_snapshot_until_confirmed(first, environment, superuser,
                                                            client_for):
    empty_site(environment, superuser)
    client = client_for("deployer")

    held = publish_via_api(client)

    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk and held.activated is False
    body = client.get(f"/api/v1/publications/{held.pk}").json()
    assert body["needs_confirmation"] == {"against": 1, "emptied": ["nginx/shop.conf"],
                                          "shrink": body["needs_confirmation"]["shrink"]}
    assert body["confirmed"] is False

    confirmed = client.post(f"/api/v1/publications/{held.pk}/confirm")

    assert confirmed.status_code == 200, confirmed.content[:300]
    assert confirmed.json()["activated"] is True and confirmed.json()["confirmed"] is True
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 2
    event = AuditEvent.objects.get(action=Action.PUBLICATION_CONFIRM)
    assert event.data["emptied"] == ["nginx/shop.conf"]
    assert event.actor.username == "deployer-user"


def test_confirm_up_front_activates_at_once(first, environment, superuser, client_for):
    empty_site(environment, superuser)

    publication = publish_via_api(client_for("deployer"), {"confirm": True})

    assert publication.activated is True and publication.needs_confirmation is None


def test_a_shrink_past_the_threshold_is_held_and_threshold_zero_turns_it_off(
        first, environment, superuser):
    releases.environment_update(environment=environment, actor=superuser,
                                shrink_threshold_percent=10,
                                config=environment.config.replace(
                                    "  - 10.0.0.2:8080\n", "").replace(
                                    "shop.example.com", "s.example"))
    held = factories.publication(environment, superuser)
    assert held.activated is False
    assert held.needs_confirmation["shrink"]["threshold_percent"] == 10
    assert held.needs_confirmation["emptied"] == []

    releases.environment_update(environment=environment, actor=superuser,
                                shrink_threshold_percent=0,
                                config=environment.config.replace("log_level: info",
                                                                  "log_level: warn"))
    assert factories.publication(environment, superuser).activated is True


def test_confirming_twice_or_what_needs_none_is_answered(first, environment, superuser,
                                                         client_for):
    client = client_for("deployer")
    plain = factories.publication(environment, superuser)  # a duplicate: nothing held
    assert_error(client.post(f"/api/v1/publications/{plain.pk}/confirm"), 409,
                 "nothing_to_confirm")
    empty_site(environment, superuser)
    held = factories.publication(environment, superuser)
    assert client.post(f"/api/v1/publications/{held.pk}/confirm").status_code == 200
    again = client.post(f"/api/v1/publications/{held.pk}/confirm")
    assert again.status_code == 200
    assert AuditEvent.objects.filter(action=Action.PUBLICATION_CONFIRM).count() == 1


def test_confirming_needs_the_deployer_role_and_a_visible_publication(
        first, environment, superuser, client_for, api_client, outsider):
    empty_site(environment, superuser)
    held = factories.publication(environment, superuser)
    url = f"/api/v1/publications/{held.pk}/confirm"
    assert_error(client_for("viewer").post(url), 403, "permission_denied")
    assert_error(api_client(outsider).post(url), 404, "not_found")
    assert_error(client_for("owner").post(
        "/api/v1/publications/00000000-0000-0000-0000-000000000000/confirm"), 404)
    assert_error(api_client().post(url), 401)
    assert Publication.objects.get(pk=held.pk).confirmed is False


def test_a_bad_confirm_flag_is_400_naming_it(first, client_for):
    error = assert_error(client_for("deployer").post(f"{ENV}/publish", {"confirm": "maybe"},
                                                     format="json"), 400)
    assert error["details"][0]["field"] == "confirm"
    assert Publication.objects.count() == 1


def test_activating_a_degenerate_snapshot_needs_confirm(application, superuser, client_for):
    env, _, _ = factories.staged_environment(application, "stage", superuser)
    env = releases.environment_update(environment=env, actor=superuser,
                                      shrink_threshold_percent=10,
                                      config=env.config.replace("log_level: info",
                                                                "log_level: ''"))
    held = factories.publication(env, superuser)  # staged: stored, and flagged
    assert held.needs_confirmation["shrink"]["percent"] >= 10
    url = f"/api/v1/environments/shop/stage/snapshots/{held.snapshot.number}/activate"
    client = client_for("deployer")

    error = assert_error(client.post(url, {}, format="json"), 409, "confirmation_required")

    assert error["details"][0]["change"] == "shrink"
    assert "shrink" in error["message"]
    assert client.post(url, {"confirm": True}, format="json").status_code == 200


@pytest.mark.parametrize("field, value", [
    ("retention_snapshots", -1), ("retention_snapshots", 1), ("retention_snapshots", 10**12),
    ("retention_bytes", 0), ("retention_bytes", 2**70), ("retention_bytes", "lots"),
    ("retention_rollouts", 0), ("shrink_threshold_percent", -5),
    ("shrink_threshold_percent", 101), ("shrink_threshold_percent", True),
    ("retention_rollouts", 1.5),
])
def test_hostile_bounds_are_400_naming_the_field_and_change_nothing(environment, client_for,
                                                                    field, value):
    before = environment.version
    response = client_for("owner").patch(ENV, {field: value}, format="json")
    error = assert_error(response, 400)
    assert error["details"][0]["field"] == field
    environment.refresh_from_db()
    assert environment.version == before


def test_owners_set_bounds_audited_as_settings(environment, client_for):
    body = {"retention_snapshots": 5, "retention_bytes": 1 << 21, "retention_rollouts": 3,
            "shrink_threshold_percent": 30}
    assert_error(client_for("deployer").patch(ENV, body, format="json"), 403)
    response = client_for("owner").patch(ENV, body, format="json")
    assert response.status_code == 200, response.content[:300]
    assert {k: response.json()[k] for k in body} == body
    event = AuditEvent.objects.filter(action=Action.ENVIRONMENT_SETTINGS).latest("id")
    assert set(event.data["fields"]) == set(body)


def test_the_service_refuses_out_of_range_bounds_too(environment, superuser):
    from apps.core.errors import ValidationFailed
    with pytest.raises(ValidationFailed) as refused:
        releases.environment_update(environment=environment, actor=superuser,
                                    retention_bytes=-1)
    assert refused.value.details[0]["field"] == "retention_bytes"


@pytest.mark.django_db(transaction=True)
def test_publish_answers_409_naming_the_emptied_file_when_it_renders_inline(
        first, environment, superuser, client_for):
    empty_site(environment, superuser)
    client = client_for("deployer")

    error = assert_error(client.post(f"{ENV}/publish", {}, format="json"), 409,
                         "confirmation_required")

    assert error["details"] == [{"file": "nginx/shop.conf", "change": "emptied"}] or any(
        d.get("change") == "shrink" for d in error["details"])
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 1
