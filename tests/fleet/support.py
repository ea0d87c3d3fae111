"""Helpers shared by the fleet tests: URLs, agent clients, polling."""

from django.db import connection
from rest_framework.test import APIClient

from tests.api.support import assert_error, publish, publish_variant

__all__ = ["assert_error", "publish", "publish_variant"]

ON_POSTGRES = connection.vendor == "postgresql"


ENV = "/api/v1/environments/shop/prod"
AGENTS = f"{ENV}/agents"
DESIRED = "/api/v1/agent/desired"
REPORTS = "/api/v1/agent/reports"
ENROLL = "/api/v1/agent/enroll"


def bundle_url(number: int) -> str:
    return f"/api/v1/agent/snapshots/{number}/bundle"


def deploy_url(number: int) -> str:
    return f"{ENV}/snapshots/{number}/deploy"


def activate_url(number: int) -> str:
    return f"{ENV}/snapshots/{number}/activate"


def agent_url(agent_id: int, suffix: str = "") -> str:
    return f"/api/v1/agents/{agent_id}{suffix}"


def bearer(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


def poll(client, etag: str | None = None, method: str = "get"):
    """A conditional GET (or HEAD) of the agent's desired state."""
    headers = {"HTTP_IF_NONE_MATCH": etag} if etag is not None else {}
    return getattr(client, method)(DESIRED, **headers)


def report(client, snapshot, status: str = "succeeded", message: str = "",
           deployment_id=None, checksum: str | None = None):
    return client.post(REPORTS, {
        "deployment_id": None if deployment_id is None else str(deployment_id),
        "snapshot": snapshot.number,
        "checksum": snapshot.checksum if checksum is None else checksum,
        "status": status,
        "message": message,
    }, format="json")
