"""Every route of the operator API the CLI calls (docs/api.md), one place each.

APPROVALS and PROMOTIONS are the shapes those features are expected to take; the
server does not have them yet, so today they answer 404 with the error envelope,
which the CLI shows like any refusal."""

from __future__ import annotations

from urllib.parse import quote

API = "/api/v1"
ENVIRONMENTS = f"{API}/environments"
DESCRIPTORS = f"{API}/descriptors"
# Not on the server yet (see the module docstring): one constant each to wire later.
APPROVALS = API + "/rollouts/{rollout}/approvals"
PROMOTIONS = API + "/environments/{environment}/promotions"


def environment(name: str) -> str:
    """shop/prod -> /api/v1/environments/shop/prod (each part quoted)."""
    application, env = name.split("/", 1)
    return f"{ENVIRONMENTS}/{quote(application, safe='')}/{quote(env, safe='')}"


def snapshots(env: str) -> str:
    return f"{environment(env)}/snapshots"


def snapshot(env: str, number: int) -> str:
    return f"{snapshots(env)}/{number}"


def rollouts(env: str) -> str:
    return f"{environment(env)}/rollouts"


def rollout(rollout_id: int) -> str:
    return f"{API}/rollouts/{rollout_id}"


def publication(publication_id: str) -> str:
    return f"{API}/publications/{quote(publication_id, safe='')}"


def approvals(rollout_id: int) -> str:
    return APPROVALS.format(rollout=rollout_id)


def promotions(env: str) -> str:
    return PROMOTIONS.format(environment=environment(env).removeprefix(ENVIRONMENTS + "/"))
