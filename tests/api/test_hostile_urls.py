"""Bytes in a URL that are not UTF-8 once percent-decoded are refused with 400
naming `path` or the query parameter, on every route, before any view runs: no
server replaces them with U+FFFD and stores or looks up the result, and
`a%FFb` and `a%EF%BF%BDb` never name the same file."""

import json

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from apps.core.handlers import UnstorableTextMiddleware
from apps.environments.models import Template
from tests.api.test_hostile_input import client_for, fingerprint, operations
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

BAD_SEGMENTS = ["a%FFb", "a%C0%AEb", "a%ED%A0%80b", "a%EF%BF%BDb", "%80", "a%E2%82b"]


def _assert_names(response, field: str):
    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == field, error
    return error


@pytest.mark.parametrize("segment", BAD_SEGMENTS)
def test_a_template_path_that_is_not_utf8_is_400_naming_path_and_stores_nothing(
        hostile_world, segment):
    client = hostile_world["user"]
    before = fingerprint()
    url = f"/api/v1/environments/shop/prod/templates/{segment}"
    for method in ("put", "get", "delete"):
        response = getattr(client, method)(url, {"source": "x\n"}, format="json")
        _assert_names(response, "path")
    assert fingerprint() == before
    assert not Template.objects.filter(path__contains="\ufffd").exists()


@pytest.mark.parametrize("op", [op for op in operations() if "{" in op[1]],
                         ids=lambda op: f"{op[0]} {op[1]}")
def test_every_route_refuses_a_path_that_is_not_utf8(op, hostile_world):
    method, path, _ = op
    before = fingerprint()
    values = dict.fromkeys(hostile_world["values"], "a%FFb")
    url = path.format(**{**values, "path": "a%FFb"})
    _assert_names(getattr(client_for(hostile_world, path), method)(url), "path")
    assert fingerprint() == before


@pytest.mark.parametrize("query", ["limit=%FF", "q%FF=1", "limit=5&state=a%C0%AE",
                                   "state=%ED%A0%80"])
def test_a_query_parameter_that_is_not_utf8_is_400_naming_it(hostile_world, query):
    response = hostile_world["user"].get(f"/api/v1/environments?{query}")
    error = _assert_names(response, query.split("&")[-1].split("=")[0].replace("%FF", "\\xff"))
    assert "UTF-8" in error["message"]


def test_valid_utf8_in_paths_and_queries_still_works(hostile_world):
    client = hostile_world["user"]
    url = "/api/v1/environments/shop/prod/templates/caf%C3%A9/%E2%82%AC.conf"
    assert client.put(url, {"source": "x\n"}, format="json").status_code in (200, 201)
    assert Template.objects.filter(path="café/€.conf").exists()
    assert client.get("/api/v1/environments?limit=5&x=%C3%A9%EF%BF%BD").status_code == 200


@pytest.mark.parametrize(("raw_path", "shown"), [
    (b"/api/v1/environments/shop/prod/templates/a%FFb",
     "/api/v1/environments/shop/prod/templates/a\ufffdb"),
    # Even were the decoded path clean, the bytes as sent decide.
    (b"/api/v1/environments/shop/prod/templates/a%FFb", "/api/v1/environments"),
    (b"/api/v1/environments/shop/prod/templates/a%EF%BF%BDb", "/api/v1/environments"),
])
def test_under_asgi_the_raw_path_is_checked(raw_path, shown):
    """An ASGI server decodes the path with U+FFFD for bad bytes; raw_path keeps them."""
    request = RequestFactory().get(shown)
    request.scope = {"raw_path": raw_path}
    response = UnstorableTextMiddleware(lambda r: HttpResponse("reached"))(request)
    assert response.status_code == 400
    assert json.loads(response.content)["error"]["details"][0]["field"] == "path"


# --- a Host header not allowed, on an API path ----------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "a b", "evil.example\x00", "[::1"])
def test_a_disallowed_host_on_an_api_path_is_the_json_envelope_naming_host(db, host):
    from django.test import Client
    response = Client().get("/api/v1/environments", HTTP_HOST=host)
    error = _assert_names(response, "Host")
    assert "host" in error["message"]


def test_a_disallowed_host_off_the_api_is_djangos_page(db):
    from django.test import Client
    response = Client().get("/login/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response["Content-Type"].startswith("text/html")


# --- labels name the key at fault -----------------------------------------------------


@pytest.mark.parametrize(("labels", "field"), [
    ({"": "x"}, 'labels.""'),
    ({"k" * 10000: "v"}, "labels." + "k" * 40 + "…"),
    ({"role": "v" * 256}, "labels.role"),
    ({f"k{i}": "v" for i in range(33)}, "labels"),
    (["role"], "labels"),
])
def test_bad_labels_name_the_key(hostile_world, labels, field):
    url = f"/api/v1/agents/{hostile_world['values']['agent_id']}"
    before = fingerprint()
    response = hostile_world["user"].patch(url, {"labels": labels}, format="json")
    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == field, error
    assert fingerprint() == before


def test_a_deploy_with_null_agents_names_agents(hostile_world):
    response = hostile_world["user"].post(
        "/api/v1/environments/shop/prod/snapshots/2/deploy", {"agents": None}, format="json")
    _assert_names(response, "agents")
