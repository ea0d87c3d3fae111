"""Every API error leaves as the error envelope of docs/design.md, with the right status."""

import pytest
from django.test import override_settings

from apps.environments.models import Environment
from tests.api.support import ENV
from tests.api_helpers import assert_error


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("patch", ENV),
        ("put", f"{ENV}/templates/extra.conf"),
        ("put", f"{ENV}/fallback-files/www/index.html"),
    ],
)
def test_malformed_json_body_is_400_parse_error(method, path, environment, owner_client):
    response = getattr(owner_client, method)(path, '{"config": "a: 1"',
                                             content_type="application/json")

    error = assert_error(response, 400, "parse_error")
    assert "JSON" in error["message"]


def test_non_json_content_type_is_415_in_the_envelope(environment, owner_client):
    response = owner_client.patch(ENV, "config=a", content_type="text/plain")

    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize("body", ['["config", "a: 1"]', '"a: 1"', "42", "null"])
def test_json_body_that_is_not_an_object_is_400(body, environment, owner_client):
    response = owner_client.patch(ENV, body, content_type="application/json")

    assert_error(response, 400)


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("patch", ENV, "config"),
        ("put", f"{ENV}/templates/big.conf", "source"),
        ("put", f"{ENV}/fallback-files/big.html", "content"),
    ],
)
def test_body_over_the_upload_limit_is_413_and_changes_nothing(
    method, path, field, environment, owner_client
):
    audit_before = environment.audit_events.count()
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=200):
        response = getattr(owner_client, method)(path, {field: "x: 1\n" * 100}, format="json")

    assert_error(response, 413, "too_large")
    environment.refresh_from_db()
    assert "x: 1" not in environment.config
    assert environment.audit_events.count() == audit_before


def test_body_just_under_the_upload_limit_is_accepted(environment, owner_client):
    body = '{"poll_interval_s": 60}'
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=len(body)):
        response = owner_client.patch(ENV, body, content_type="application/json")

    assert response.status_code == 200
    assert response.json()["poll_interval_s"] == 60


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/nope",
        "/api/v1/environments/shop",
        "/api/v1/environments/shop/prod/nope",
        "/api/v1/environments/shop/prod/snapshots/-1",
        "/api/v1/environments/shop/prod/snapshots/one",
        "/api/v1/publications/not-a-uuid",
        "/api/v2/environments",
    ],
)
def test_unknown_api_route_is_404_json_envelope(path, environment, owner_client):
    response = owner_client.get(path)

    error = assert_error(response, 404, "not_found")
    assert path in error["message"]


def test_unknown_api_route_is_404_json_even_for_anonymous_clients(client):
    response = client.get("/api/v1/nope")

    assert_error(response, 404, "not_found")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("delete", "/api/v1/environments"),
        ("put", ENV),
        ("post", f"{ENV}/preview"),
        ("get", f"{ENV}/publish"),
        ("delete", f"{ENV}/snapshots/1"),
        ("get", f"{ENV}/snapshots/1/rollback"),
    ],
)
def test_wrong_method_is_405_in_the_envelope(method, path, snapshots, owner_client):
    response = getattr(owner_client, method)(path)

    assert_error(response, 405, "method_not_allowed")


def test_validation_error_names_each_field_in_details(environment, owner_client):
    response = owner_client.patch(
        ENV, {"poll_interval_s": "often", "config_schema": [1]}, format="json"
    )

    error = assert_error(response, 400, "invalid")
    assert {d["field"] for d in error["details"]} == {"poll_interval_s", "config_schema"}
    assert error["message"].split(":")[0] in {"poll_interval_s", "config_schema"}
    assert Environment.objects.get(pk=environment.pk).poll_interval_s == 30
