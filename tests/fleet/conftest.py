"""Fixtures for the fleet tests: enrolled agents with their own clients, snapshots,
operator clients per role, and a cache emptied around every test."""

from dataclasses import dataclass
from datetime import timedelta

import pytest
from django.core.cache import cache
from django.utils import timezone

from apps.environments.models import Environment
from apps.fleet import enrollment, services
from apps.fleet.models import Agent, EnrollmentToken
from apps.snapshots.models import Snapshot
from tests.fleet.support import bearer, publish


@pytest.fixture(autouse=True)
def _empty_cache():
    """The cache is shared (locmem in-process, or a Redis database): start and end empty."""
    cache.clear()
    yield
    cache.clear()


@dataclass
class Enrolled:
    agent: Agent
    token: str

    @property
    def client(self):
        return bearer(self.token)

    def fresh(self) -> Agent:
        self.agent.refresh_from_db()
        return self.agent


@pytest.fixture
def enrollment_token(environment, superuser):
    """enrollment_token(uses=1, env=None) -> (EnrollmentToken, secret)."""

    def make(uses: int = 1, env=None) -> tuple[EnrollmentToken, str]:
        return enrollment.enrollment_token_create(
            environment=env or environment, max_uses=uses,
            expires_at=timezone.now() + timedelta(hours=1), actor=superuser,
        )

    return make


@pytest.fixture
def enroll(enrollment_token, superuser):
    """enroll("web-1", mode="manual") -> an Enrolled agent of shop/prod (or `env`)."""

    def make(name: str = "web-1", mode: str = "auto_pull", env=None, labels=None) -> Enrolled:
        _, secret = enrollment_token(env=env)
        agent, token = enrollment.agent_enroll(enrollment_token=secret, name=name,
                                             labels=labels or {})
        if mode != agent.mode:
            agent = services.agent_update(agent=agent, actor=superuser, mode=mode)
        return Enrolled(agent, token)

    return make


@pytest.fixture
def first(environment, superuser) -> Snapshot:
    """shop/prod's snapshot #1, published and active."""
    snapshot = publish(environment, superuser)
    assert (snapshot.number, snapshot.state) == (1, "ready")
    return snapshot


@pytest.fixture
def blog(outsider):
    """blog/prod: another tenant's environment (the outsider owns it)."""
    return Environment.objects.get(application__name="blog", name="prod")


@pytest.fixture
def client_for(api_client, member):
    """client_for("deployer") -> an API client of a new tenant member with that role."""

    def make(role: str):
        return api_client(member(role, username=f"{role}-user"))

    return make
