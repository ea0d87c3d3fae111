"""A request with more query parameters (or form fields, or files) than Django
parses (DATA_UPLOAD_MAX_NUMBER_FIELDS, _FILES) is answered 400 naming `query` or
`body` — the envelope on API paths, a plain page elsewhere — on every route, with
DEBUG on too (whose error page would read them again and fail with a 500), and
before any view runs."""

import pytest
from django.test import Client

from tests.api.test_hostile_input import client_for, fingerprint
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

MANY = "&".join(f"p{i}=1" for i in range(1500))
DASHBOARD = "/e/shop/prod/"


def _names(response, field: str):
    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == field, error
    assert "1000 parameters" in error["message"]


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/environments"), ("post", "/api/v1/descriptors"),
    ("post", "/api/v1/agent/drift"), ("get", "/api/v1/agent/desired"),
    ("get", "/api/v1/environments/shop/prod"), ("get", "/api/v1/no-such-route"),
])
def test_too_many_query_parameters_on_the_api_is_400_naming_query(
        hostile_world, settings, method, path, debug):
    settings.DEBUG = debug
    before = fingerprint()
    client = client_for(hostile_world, path)
    if method == "get":
        response = client.get(f"{path}?{MANY}")
    else:
        response = client.post(f"{path}?{MANY}", data=b"{}", content_type="application/json")
    _names(response, "query")
    assert fingerprint() == before


def test_anonymous_is_refused_the_same_way(hostile_world):
    _names(Client().get(f"/api/v1/environments?{MANY}"), "query")


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/", DASHBOARD, "/login/", "/admin/", "/nope/"])
def test_too_many_query_parameters_on_a_page_is_a_plain_400(
        hostile_world, settings, path, debug):
    settings.DEBUG = debug
    client = Client()
    client.force_login(hostile_world["superuser"])
    response = client.get(f"{path}?{MANY}")
    assert response.status_code == 400
    assert b"query: more than 1000 parameters" in response.content


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("path", ["/login/", f"{DASHBOARD}deploy/", "/api/v1/descriptors"])
def test_too_many_form_fields_is_400_naming_the_body(hostile_world, settings, path, debug):
    settings.DEBUG = debug
    client = Client(enforce_csrf_checks=True)
    client.force_login(hostile_world["superuser"])
    before = fingerprint()
    response = client.post(path, data=MANY, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert b"body" in response.content and b"more than 1000 parameters" in response.content
    assert fingerprint() == before


def test_too_many_files_is_400_naming_the_body(hostile_world, settings):
    settings.DEBUG = True
    files = {f"f{i}": __import__("io").BytesIO(b"x") for i in range(101)}
    response = Client().post("/api/v1/descriptors", data=files)
    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "body"
    assert "100 files" in error["message"]


def test_under_the_bound_the_query_is_read_as_before(hostile_world):
    response = hostile_world["user"].get("/api/v1/environments?" + MANY[:5000].rsplit("&", 1)[0])
    assert response.status_code == 200
