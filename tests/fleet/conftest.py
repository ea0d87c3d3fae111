"""Fixtures for the fleet tests: enrollment tokens, enrolled agents with their own
clients, a deployer's client, and a cache emptied around every test."""

import collections

import pytest

from apps.core import metrics
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


def _to_django() -> collections.Counter:
    return collections.Counter({
        sample.labels["reason"]: sample.value for metric in metrics.POLLS_FROM_DATABASE.collect()
        for sample in metric.samples if sample.name.endswith("_total")})


@pytest.fixture
def to_django():
    """to_django() -> the polls answered from the database, by reason, since the
    test began or since the last call."""
    seen = [_to_django()]

    def since():
        now = _to_django()
        passed, seen[0] = dict(now - seen[0]), now
        return passed

    return since
