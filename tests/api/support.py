"""Helpers shared by the API tests: URLs, the error-envelope check, snapshot making."""

import re

from apps.releases.publishing import publication_complete
from apps.releases.services import environment_update, snapshot_publish
from apps.snapshots.models import Snapshot

ENV = "/api/v1/environments/shop/prod"
OTHER_ENV = "/api/v1/environments/blog/prod"
MISSING_ENV = "/api/v1/environments/nosuch/prod"


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


def publish(environment, actor) -> Snapshot:
    """Publish the environment's current inputs and render them now (no API, no on_commit)."""
    publication = snapshot_publish(environment=environment, actor=actor)
    return publication_complete(publication_id=str(publication.pk)).snapshot


def publish_variant(environment, actor, workers: int) -> Snapshot:
    """A new ready snapshot whose content differs from the others by `workers`."""
    environment.refresh_from_db()
    config = re.sub(r"^workers: .*$", f"workers: {workers}", environment.config, flags=re.M)
    environment = environment_update(environment=environment, config=config, actor=actor)
    return publish(environment, actor)


# Every API route, as (method, path, role needed, body). `{env}` is an environment's
# "<application>/<name>", `{publication}` the id of a publication of shop/prod.
ROUTES = [
    ("get", "/api/v1/environments", "viewer", None),
    ("get", "/api/v1/environments/{env}", "viewer", None),
    ("patch", "/api/v1/environments/{env}", "owner", {"poll_interval_s": 60}),
    ("get", "/api/v1/environments/{env}/templates/nginx/shop.conf", "viewer", None),
    ("put", "/api/v1/environments/{env}/templates/extra/new.conf", "owner", {"source": "x\n"}),
    ("delete", "/api/v1/environments/{env}/templates/shop/app.json", "owner", None),
    ("get", "/api/v1/environments/{env}/fallback-files/www/index.html", "viewer", None),
    ("put", "/api/v1/environments/{env}/fallback-files/www/new.html", "owner",
     {"content": "<p>down</p>\n"}),
    ("delete", "/api/v1/environments/{env}/fallback-files/www/index.html", "owner", None),
    ("get", "/api/v1/environments/{env}/preview", "viewer", None),
    ("post", "/api/v1/environments/{env}/publish", "deployer", None),
    ("get", "/api/v1/environments/{env}/pending", "viewer", None),
    ("get", "/api/v1/environments/{env}/audit", "viewer", None),
    ("get", "/api/v1/environments/{env}/snapshots", "viewer", None),
    ("get", "/api/v1/environments/{env}/snapshots/2", "viewer", None),
    ("get", "/api/v1/environments/{env}/snapshots/2/diff", "viewer", None),
    ("post", "/api/v1/environments/{env}/snapshots/1/rollback", "deployer", None),
    ("get", "/api/v1/publications/{publication}", "viewer", None),
]

ENV_ROUTES = [route for route in ROUTES if "{env}" in route[1]]


def route_id(route) -> str:
    method, path, *_ = route
    return f"{method.upper()} {path.removeprefix('/api/v1/')}"


def call(client, method: str, url: str, body=None):
    if body is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, body, format="json")
