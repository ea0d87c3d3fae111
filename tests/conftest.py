"""Fixtures every directory shares, built with tests/factories.py: users with roles,
the shop-team tenant with shop/prod, an outsider with blog/prod, API clients,
shop/prod's first snapshot, and an emptied cache.

Tests marked `postgres` or `redis` skip when that service is not configured,
and fail instead when BELLWETHER_REQUIRE_SERVICES=1 (as .ci/run sets).
"""

import os

import pytest
from django.conf import settings
from django.core.cache import cache

from apps.environments.models import Environment
from apps.tenancy.models import Role
from project.celery import app as celery_app
from tests import factories

REQUIRE_SERVICES = os.environ.get("BELLWETHER_REQUIRE_SERVICES") == "1"


def _redis_available() -> bool:
    if not settings.REDIS_URL:
        return False
    import redis

    try:
        return bool(redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2).ping())
    except redis.RedisError:
        return False


def pytest_runtest_setup(item):
    missing = []
    if item.get_closest_marker("postgres") and settings.DATABASES["default"][
        "ENGINE"
    ] != "django.db.backends.postgresql":
        missing.append("PostgreSQL (set DATABASE_URL)")
    if item.get_closest_marker("redis") and not _redis_available():
        missing.append("Redis (set REDIS_URL)")
    if missing:
        message = "needs " + " and ".join(missing)
        if REQUIRE_SERVICES:
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)


@pytest.fixture(autouse=True)
def _test_settings(settings):
    """A fast password hasher (fixtures make many users), and static files served
    unhashed: settings pick WhiteNoise's manifest storage, whose {% static %} needs
    the manifest `collectstatic` writes (a deploy step) once DEBUG is off, as it is
    in tests. No API throttling unless a test sets rates (tests/api/test_throttling.py):
    on SQLite, ids are reused from test to test, so one user's counts would carry
    over within the minute."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.BELLWETHER_THROTTLE_RATES = dict.fromkeys(settings.BELLWETHER_THROTTLE_RATES)
    settings.STORAGES = {
        **settings.STORAGES,
        "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    }


@pytest.fixture(autouse=True)
def _fresh_heartbeat_buffer(monkeypatch):
    """Heartbeats are buffered per process; each test starts with an empty buffer
    (database ids are reused between tests)."""
    from apps.fleet import cache as fleet_cache

    monkeypatch.setattr(fleet_cache, "_heartbeats", fleet_cache._HeartbeatBuffer())


@pytest.fixture(autouse=True)
def _fresh_poll_debts(monkeypatch):
    """Each test starts like a new process: no poll debts read yet."""
    from apps.fleet import polldebt

    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts())


@pytest.fixture(autouse=True)
def _fresh_blocked_addresses(monkeypatch):
    """Each test starts like a new process: no address refused for its failed
    authentications."""
    from apps.core import throttling

    monkeypatch.setattr(throttling, "blocked_addresses", throttling._BlockedAddresses())


@pytest.fixture(autouse=True)
def _closed_breakers():
    """Each test starts with no remembered dependency failure."""
    from apps.core.breaker import best_effort_redis

    best_effort_redis.reset()
    yield
    best_effort_redis.reset()


@pytest.fixture(autouse=True, scope="session")
def _tasks_inline():
    """Tasks run inline in tests unless a test starts a real worker."""
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.fixture
def empty_cache():
    """The cache is shared (local memory in-process, or a Redis database) and holds
    poll states and heartbeats keyed by ids the database reuses: start and end the
    test with it empty (the fleet, rollout, dashboard and browser tests use it for
    every test)."""
    cache.clear()
    yield
    cache.clear()


# --- people, tenants and shop/prod ------------------------------------------------------


@pytest.fixture
def make_user(db):
    """make_user("alice", is_staff=True) -> a user whose password is "pw-alice"."""
    return factories.user


@pytest.fixture
def superuser(db):
    return factories.superuser()


@pytest.fixture
def tenant(superuser):
    return factories.tenant(actor=superuser)


@pytest.fixture
def application(tenant, superuser):
    return factories.application(tenant, actor=superuser)


@pytest.fixture
def environment(application, superuser):
    """shop/prod: CONFIG with the nginx and app templates, nothing published."""
    return factories.environment(application, "prod", templates=factories.SHOP_TEMPLATES,
                                 actor=superuser)


@pytest.fixture
def member(tenant, superuser):
    """member("deployer") -> a user with that role in the tenant."""

    def make(role: str, username: str | None = None):
        return factories.member(tenant, role, username=username, actor=superuser)

    return make


@pytest.fixture
def outsider(superuser):
    """A user who belongs to another tenant, with its own environment (blog/prod)."""
    user = factories.user("outsider")
    other = factories.tenant(name="Other team", slug="other", actor=superuser)
    factories.membership(other, user, Role.OWNER, actor=superuser)
    blog = factories.application(other, name="blog", actor=superuser)
    factories.environment(blog, "prod", config="a: 1\n", actor=superuser)
    return user


@pytest.fixture
def api_client():
    """api_client(user) -> an APIClient authenticated with a real API token."""
    return factories.api_client_for


@pytest.fixture
def client_for(api_client, member):
    """client_for("deployer") -> an API client of a new tenant member with that role."""

    def make(role: str):
        return api_client(member(role, username=f"{role}-user"))

    return make


@pytest.fixture
def blog(outsider):
    """blog/prod: another tenant's environment (the outsider owns it)."""
    return Environment.objects.get(application__name="blog", name="prod")


# --- snapshots --------------------------------------------------------------------------


@pytest.fixture
def first(environment, superuser):
    """shop/prod's snapshot #1, published and active (what agents have to begin with)."""
    snapshot = factories.publish(environment, superuser)
    assert (snapshot.number, snapshot.state) == (1, "ready")
    environment.refresh_from_db()
    assert environment.active_snapshot_id == snapshot.pk
    return snapshot
