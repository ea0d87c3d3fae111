"""Fixtures for the rollout tests: an environment whose snapshot #1 is active and
whose #2 is ready but not activated, enrolled agents, and operator clients."""

import pytest
from django.core.cache import cache

from apps.releases.services import environment_update
from tests.fleet.support import publish, publish_variant
from tests.rollouts.support import enroll_many, staged_environment


@pytest.fixture(autouse=True)
def _empty_cache():
    """Poll states live in the cache (local memory or a Redis database): start and
    end every test with it empty."""
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def first(environment, superuser):
    """shop/prod's snapshot #1, published and active (what agents have before a rollout)."""
    snapshot = publish(environment, superuser)
    assert (snapshot.number, snapshot.state) == (1, "ready")
    environment.refresh_from_db()
    assert environment.active_snapshot_id == snapshot.pk
    return snapshot


@pytest.fixture
def second(first, environment, superuser):
    """Snapshot #2 of shop/prod: ready, with other content, and NOT active (the
    environment now requires explicit activation) — what a rollout stages."""
    environment_update(environment=environment, require_activation=True, actor=superuser)
    snapshot = publish_variant(environment, superuser, workers=8)
    assert (snapshot.number, snapshot.state) == (2, "ready")
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk
    return snapshot


@pytest.fixture
def staging(application, superuser):
    """shop/staging as (environment, first, second), staged like shop/prod."""
    return staged_environment(application, "staging", superuser)


@pytest.fixture
def fleet(environment):
    """fleet(3, prefix="web", labels={...}) -> that many enrolled agents of shop/prod,
    named web-1..web-3, as Node(agent, token)."""

    def make(count: int, prefix: str = "web", labels: dict | None = None, env=None,
             start: int = 1):
        return enroll_many(env or environment, count, prefix=prefix, labels=labels,
                           start=start)

    return make


@pytest.fixture
def client_for(api_client, member):
    """client_for("deployer") -> an API client of a new tenant member with that role."""

    def make(role: str):
        return api_client(member(role, username=f"{role}-user"))

    return make
