"""Every route of the operator API the CLI calls (docs/api.md), one place each."""

from __future__ import annotations

from urllib.parse import quote

API = "/api/v1"
ENVIRONMENTS = f"{API}/environments"
DESCRIPTORS = f"{API}/descriptors"
RELEASE = API + "/releases/{release}"  # a release asking for approval (governance)


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


def release(release_id: int) -> str:
    return RELEASE.format(release=release_id)


def promote(env: str) -> str:
    return f"{environment(env)}/promote"
