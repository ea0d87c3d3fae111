"""Fixtures of the governance tests: shop/prod staged with #1 active and #2 ready,
two owners who may approve, a deployer who asks, and a rule of two approvals."""

import pytest

from apps.governance import rules, services
from apps.releases.services import environment_update
from tests import factories


@pytest.fixture(autouse=True)
def _empty_cache(empty_cache):
    """Poll states live in the cache: start and end each test with it empty."""


@pytest.fixture
def second(first, environment, superuser):
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    snapshot = factories.publish_variant(environment, superuser, workers=8)
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk and snapshot.number == 2
    return snapshot


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
