"""Every page carries a Content-Security-Policy that allows only this origin's
scripts (no inline script, no eval), styles, images and connections, no plugins and
no framing; the API docs page alone allows inline styles (Swagger UI's), never
inline script. The browser tests check the dashboard and the admin work under it
with no violation in the console (tests/browser)."""

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def _policy(response) -> dict[str, list[str]]:
    header = response["Content-Security-Policy"]
    directives = [d.strip().split() for d in header.split(";") if d.strip()]
    return {d[0]: d[1:] for d in directives}


@pytest.mark.parametrize("path", ["/login/", "/admin/login/", "/"])
def test_pages_allow_only_this_origins_scripts_and_styles(path, make_user):
    client = Client()
    client.force_login(make_user("alice", is_staff=True))

    policy = _policy(client.get(path, follow=True))

    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["connect-src"] == ["'self'"]
    assert policy["object-src"] == ["'none'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["default-src"] == ["'self'"]


def test_the_api_docs_allow_inline_styles_but_no_inline_script(make_user):
    client = Client()
    client.force_login(make_user("alice"))

    response = client.get("/api/docs/")

    assert response.status_code == 200
    policy = _policy(response)
    assert policy["style-src"] == ["'self'", "'unsafe-inline'"]
    assert policy["script-src"] == ["'self'"]
    assert "<script>" not in response.content.decode()  # its script is served apart


def test_htmx_is_told_to_inject_no_style_and_evaluate_nothing(make_user):
    client = Client()
    client.force_login(make_user("alice"))

    html = client.get("/").content.decode()

    assert '"includeIndicatorStyles": false' in html
    assert '"allowEval": false' in html
