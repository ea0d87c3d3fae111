"""Helpers of the fleet tests: URLs, enrolling and reporting over HTTP as an agent does."""

from rest_framework.test import APIClient

ENV = "/api/v1/environments/shop/prod"
AGENTS = f"{ENV}/agents"
REPORTS = "/api/v1/agent/reports"
ENROLL = "/api/v1/agent/enroll"


def bundle_url(number: int) -> str:
    return f"/api/v1/agent/snapshots/{number}/bundle"


def unvouched_authorization(token: str, case: str) -> str | None:
    """The Authorization header of an agent holding `token`, in a `case` no cache can
    vouch for (None: no header)."""
    key = token.split(".")[0]
    return {"no Authorization": None, "Basic": "Basic " + token,
            "a user token": f"Bearer {token}".replace("bwa_", "bwu_"),
            "a wrong secret": f"Bearer {key}.{'x' * 43}",
            "an unknown key": f"Bearer {token}".replace(key, "bwa_000000000000")}[case]


def deploy_url(number: int) -> str:
    return f"{ENV}/snapshots/{number}/deploy"


def activate_url(number: int) -> str:
    return f"{ENV}/snapshots/{number}/activate"


def agent_url(agent_id: int, suffix: str = "") -> str:
    return f"/api/v1/agents/{agent_id}{suffix}"


def enroll_over_http(secret: str, name: str = "web-1", labels=None):
    """POST /api/v1/agent/enroll with an enrollment token, as a new agent (no
    credentials) does; `labels` are sent when given."""
    body = {"enrollment_token": secret, "name": name}
    if labels is not None:
        body["labels"] = labels
    return APIClient().post(ENROLL, body, format="json")


def report(client, snapshot, status: str = "succeeded", message: str = "",
           deployment_id=None, checksum: str | None = None):
    return client.post(REPORTS, {
        "deployment_id": None if deployment_id is None else str(deployment_id),
        "snapshot": snapshot.number,
        "checksum": snapshot.checksum if checksum is None else checksum,
        "status": status,
        "message": message,
    }, format="json")
