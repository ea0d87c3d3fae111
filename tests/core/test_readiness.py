"""/readyz (readiness) beside /healthz (liveness), and how a database error leaves a
view: 503 with the error envelope, never a 500. The real outage is
tests/faults/test_database_down.py."""

import json
from pathlib import Path

import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import InterfaceError, OperationalError
from django.test import AsyncClient, Client, RequestFactory
from rest_framework.views import APIView

from apps.core.api import exception_handler
from apps.core.handlers import DatabaseUnavailableMiddleware


def test_readyz_answers_ready_when_the_database_answers(db, client, settings):
    settings.REDIS_URL = ""
    response = client.get("/readyz")
    assert (response.status_code, response.json()) == (
        200, {"status": "ready", "database": "ok", "redis": "not configured"})


def test_the_favicon_browsers_ask_for_leads_to_the_dashboards_svg_icon(client):
    response = client.get("/favicon.ico")
    assert response.status_code == 302
    assert response["Location"].startswith("/static/bellwether/favicon")
    assert response["Location"].endswith(".svg")
    assert response["Cache-Control"] == "public, max-age=86400"


def test_the_favicon_is_a_real_svg_icon():
    from django.contrib.staticfiles import finders

    path = finders.find("bellwether/favicon.svg")
    assert path and Path(path).read_text().startswith("<svg xmlns=")


def test_a_database_error_in_an_api_view_is_503_unavailable():
    for error in (OperationalError("connection refused"), InterfaceError("closed")):
        response = exception_handler(error, {"view": APIView()})
        assert response.status_code == 503
        assert response.data["error"]["code"] == "unavailable"
        assert response["Retry-After"] == "5"


def test_a_database_error_outside_drf_is_503_not_500():
    middleware = DatabaseUnavailableMiddleware(lambda request: None)
    factory = RequestFactory()

    api = middleware.process_exception(factory.get("/api/v1/x"), OperationalError("down"))
    page = middleware.process_exception(factory.get("/"), OperationalError("down"))

    assert (api.status_code, json.loads(api.content)["error"]["code"]) == (503, "unavailable")
    assert (page.status_code, page["Content-Type"]) == (503, "text/plain")
    assert middleware.process_exception(factory.get("/"), ValueError("a bug")) is None


def _session_save_fails(monkeypatch):
    def save(self, must_create=False):
        raise OperationalError("connection to server failed: Connection refused")

    monkeypatch.setattr(SessionStore, "save", save)


@pytest.mark.urls("tests.core.session_urls")
def test_the_session_failing_to_save_after_the_view_is_503_not_500(db, monkeypatch):
    _session_save_fails(monkeypatch)
    client = Client(raise_request_exception=False)

    page = client.get("/page/")
    api = client.get("/api/v1/page")

    assert (page.status_code, page["Content-Type"], page["Retry-After"]) == (
        503, "text/plain", "5")
    assert api.status_code == 503
    assert api.json()["error"]["code"] == "unavailable"


@pytest.mark.urls("tests.core.session_urls")
async def test_over_asgi_the_session_failing_after_the_view_is_503_too(db, monkeypatch):
    """Under ASGI Django builds the 500 in another thread; the failure still reaches
    the handler, so it is told apart from a bug."""
    _session_save_fails(monkeypatch)

    api = await AsyncClient(raise_request_exception=False).get("/api/v1/page")

    assert api.status_code == 503
    assert json.loads(api.content)["error"]["code"] == "unavailable"


def test_a_session_that_cannot_be_read_is_503_on_pages_and_the_api(
        db, monkeypatch, superuser):
    from tests import factories

    client = factories.session_client(superuser, raise_request_exception=False)

    def load(self):
        raise OperationalError("connection to server failed: Connection refused")

    monkeypatch.setattr(SessionStore, "load", load)
    page = client.get("/")
    api = client.get("/api/v1/environments")

    assert page.status_code == 503
    assert (api.status_code, api.json()["error"]["code"]) == (503, "unavailable")


@pytest.mark.urls("tests.core.session_urls")
def test_a_bug_after_the_view_is_still_a_500(db, monkeypatch):
    def save(self, must_create=False):
        raise ValueError("a bug")

    monkeypatch.setattr(SessionStore, "save", save)
    response = Client(raise_request_exception=False).get("/api/v1/page")
    assert (response.status_code, response.json()["error"]["code"]) == (500, "internal")
