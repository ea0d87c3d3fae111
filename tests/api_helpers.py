"""Helpers for API tests in any directory: the error-envelope check, and calling one
route of a route table."""

from django.db import transaction


def assert_error(response, status: int, code: str | None = None) -> dict:
    """The body is exactly the error envelope (docs/design.md) {"error": {"code", "message", ...}}
    with `status` (and `code`); `details` when present is a list."""
    assert response.status_code == status, (response.status_code, response.content[:500])
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error.get("code"), str) and error["code"], body
    assert isinstance(error.get("message"), str) and error["message"], body
    assert isinstance(error.get("details", []), list), body
    if code is not None:
        assert error["code"] == code, body
    return error


def route_id(route) -> str:
    """A route (method, path, ...) as a test id: "GET environments/{env}"."""
    method, path, *_ = route
    return f"{method.upper()} {path.removeprefix('/api/v1/')}"


def call(client, method: str, url: str, body=None):
    """`client`'s request with `method` to `url`, with `body` as JSON when given."""
    if body is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, body, format="json")


def call_undone(client, method: str, url: str, body=None):
    """`call`, with what the request stored rolled back after it: each route of a
    table a test walks sees the same world."""
    with transaction.atomic():
        response = call(client, method, url, body)
        transaction.set_rollback(True)
    return response
