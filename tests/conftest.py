"""Shared fixtures: users with roles, a tenant with an environment, API clients.

Tests marked `postgres` or `redis` skip when that service is not configured,
and fail instead when BELLWETHER_REQUIRE_SERVICES=1 (as .ci/run sets).
"""

import os

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from apps.environments.services import environment_create, environment_file_put
from apps.tenancy.models import Role
from apps.tenancy.services import (
    api_token_create,
    application_create,
    membership_set,
    tenant_create,
)
from project.celery import app as celery_app

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
    in tests."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
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


@pytest.fixture(autouse=True, scope="session")
def _tasks_inline():
    """Tasks run inline in tests unless a test starts a real worker."""
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


NGINX_TEMPLATE = """server {
    listen {{ listen }};
    server_name {{ server_name }};
{% for upstream in upstreams %}    # upstream {{ upstream }}
{% endfor %}}
"""

APP_TEMPLATE = '{"log_level": {{ log_level | tojson }}, "workers": {{ workers }}}\n'

CONFIG = """listen: 80
server_name: shop.example.com
upstreams:
  - 10.0.0.1:8080
  - 10.0.0.2:8080
log_level: info
workers: 4
"""


@pytest.fixture
def make_user(db):
    def make(username: str, **extra):
        return get_user_model().objects.create_user(
            username=username, password="pw-" + username, **extra
        )

    return make


@pytest.fixture
def superuser(db):
    return get_user_model().objects.create_superuser("root", "root@example.com", "pw-root")


@pytest.fixture
def tenant(superuser):
    return tenant_create(name="Shop team", slug="shop-team", actor=superuser)


@pytest.fixture
def application(tenant, superuser):
    return application_create(tenant=tenant, name="shop", actor=superuser)


@pytest.fixture
def environment(application, superuser):
    env = environment_create(application=application, name="prod", config=CONFIG,
                             actor=superuser)
    environment_file_put(environment=env, kind="template", path="nginx/shop.conf",
                         text=NGINX_TEMPLATE, actor=superuser)
    environment_file_put(environment=env, kind="template", path="shop/app.json",
                         text=APP_TEMPLATE, actor=superuser)
    return env


@pytest.fixture
def member(make_user, tenant, superuser):
    """member("deployer") -> a user with that role in the tenant."""

    def make(role: str, username: str | None = None):
        user = make_user(username or role)
        membership_set(tenant=tenant, user=user, role=role, actor=superuser)
        return user

    return make


@pytest.fixture
def outsider(make_user, superuser):
    """A user who belongs to another tenant, with its own environment."""
    user = make_user("outsider")
    other = tenant_create(name="Other team", slug="other", actor=superuser)
    membership_set(tenant=other, user=user, role=Role.OWNER, actor=superuser)
    app = application_create(tenant=other, name="blog", actor=superuser)
    environment_create(application=app, name="prod", config="a: 1\n", actor=superuser)
    return user


@pytest.fixture
def api_client():
    """api_client(user) -> an APIClient authenticated with a real API token."""

    def make(user=None):
        client = APIClient()
        if user is not None:
            _, secret = api_token_create(user=user, name="test", actor=user)
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        return client

    return make
