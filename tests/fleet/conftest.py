"""Fixtures for the fleet tests: enrollment tokens, enrolled agents with their own
clients, a deployer's client, and a cache emptied around every test."""

import pytest

from tests import factories


@pytest.fixture(autouse=True)
def _empty_cache(empty_cache):
    """Poll answers and heartbeats live in the cache: every fleet test starts and
    ends with it empty."""


@pytest.fixture
def enrollment_token(environment, superuser):
    """enrollment_token(uses=1, env=None) -> (EnrollmentToken, secret)."""

    def make(uses: int = 1, env=None):
        return factories.enrollment_token(env or environment, uses=uses, actor=superuser)

    return make


@pytest.fixture
def enroll(environment, superuser):
    """enroll("web-1", mode="manual") -> an EnrolledAgent of shop/prod (or `env`)."""

    def make(name: str = "web-1", mode: str = "auto_pull", env=None, labels=None):
        return factories.enrolled_agent(env or environment, name, labels=labels, mode=mode,
                                        actor=superuser)

    return make


@pytest.fixture
def deployer(client_for):
    """An API client of a deployer of the tenant."""
    return client_for("deployer")
