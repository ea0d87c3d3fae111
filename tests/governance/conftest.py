"""Fixtures of the governance tests: shop/prod staged with #1 active and #2 ready,
two owners who may approve, a deployer who asks, and a rule of two approvals."""

import pytest

from apps.governance import rules, services


@pytest.fixture(autouse=True)
def _empty_cache(empty_cache):
    """Poll states live in the cache: start and end each test with it empty."""


@pytest.fixture
def second(second_staged):
    """shop/prod's #2, ready and not active (the release policy staged)."""
    return second_staged


@pytest.fixture
def alice(member):
    return member("owner", username="alice")


@pytest.fixture
def bob(member):
    return member("owner", username="bob")


@pytest.fixture
def deployer(member):
    return member("deployer", username="dora")


@pytest.fixture
def two_approvals(environment, superuser):
    """shop/prod needs two approvals by its owners."""
    return services.approval_rule_set(environment=environment, actor=superuser,
                                      required_approvals=2)


@pytest.fixture
def activation(second, environment, deployer, two_approvals):
    """A release asking to activate #2 (by the deployer), under two approvals."""
    return services.release_submit(environment=environment, snapshot=second,
                                   plan=rules.activation_plan(), actor=deployer)


def approve(release, user, comment: str = ""):
    release.refresh_from_db()
    return services.release_decide(release=release, actor=user, decision="approve",
                                   checksum=release.checksum, plan_digest=release.plan_digest,
                                   comment=comment)
