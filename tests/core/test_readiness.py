"""/readyz (readiness) beside /healthz (liveness), and how a database error leaves a
view: 503 with the error envelope, never a 500. The real outage is
tests/faults/test_database_down.py."""

import json

from django.db import InterfaceError, OperationalError
from django.test import RequestFactory
from rest_framework.views import APIView

from apps.core.api import exception_handler
from apps.core.handlers import DatabaseUnavailableMiddleware


def test_readyz_answers_ready_when_the_database_answers(db, client, settings):
    settings.REDIS_URL = ""
    response = client.get("/readyz")
    assert (response.status_code, response.json()) == (
        200, {"status": "ready", "database": "ok", "redis": "not configured"})


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
