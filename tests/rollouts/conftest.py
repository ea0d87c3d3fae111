"""Fixtures for the rollout tests: an environment whose snapshot #1 is active (the
shared `first`) and whose #2 is ready but not activated, and enrolled agents."""

import pytest

from apps.releases.services import environment_update
from tests.factories import enrolled_agents, staged_environment


@pytest.fixture(autouse=True)
def _empty_cache(empty_cache):
    """Poll states live in the cache: every rollout test starts and ends with it empty."""


@pytest.fixture
def second(second_staged):
    """Snapshot #2 of shop/prod: ready, with other content, and NOT active (the
    environment requires explicit activation) — what a rollout stages."""
    return second_staged


@pytest.fixture
def staging(application, superuser):
    """shop/staging as (environment, first, second), staged like shop/prod."""
    return staged_environment(application, "staging", superuser)


@pytest.fixture
def fleet(environment):
    """fleet(3, prefix="web", labels={...}) -> that many enrolled agents of shop/prod,
    named web-1..web-3, as EnrolledAgent(agent, token)."""

    def make(count: int, prefix: str = "web", labels: dict | None = None, env=None,
             start: int = 1):
        return enrolled_agents(env or environment, count, prefix=prefix, labels=labels,
                               start=start)

    return make


@pytest.fixture
def keep_pins(environment, superuser):
    """shop/prod keeps a finished rollout's pins until they are released explicitly
    (the stricter setting; by default they are released when the rollout ends)."""
    environment_update(environment=environment, keep_rollout_pins=True, actor=superuser)
