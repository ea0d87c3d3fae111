"""Fixtures every directory shares, built with tests/factories.py: users with roles,
the shop-team tenant with shop/prod, an outsider with blog/prod, API clients,
shop/prod's first snapshot, and an emptied cache.

Tests marked `postgres` or `redis` skip when that service is not configured,
and fail instead when BELLWETHER_REQUIRE_SERVICES=1 (as .ci/run sets).
"""

import os

import hypothesis
import pytest
from django.conf import settings
from django.core.cache import cache
from django.db import connection, transaction
from django.test import override_settings
from pytest_django.fixtures import validate_django_db

from apps.environments.models import Environment
from apps.tenancy.models import Role
from project import gc_tuning
from project.celery import app as celery_app
from tests import agentroutes, factories
from tests.flush import written_tables_only
from tests.world import KeptChain, build_second

agentroutes.install()  # the agents' routes through the ASGI stack, as served

REQUIRE_SERVICES = os.environ.get("BELLWETHER_REQUIRE_SERVICES") == "1"

# Property tests draw as many examples as the profile says: "suite" (make test) a few
# dozen each, "check" (make check) ten, "thorough" (HYPOTHESIS_PROFILE=thorough) a
# thousand; the schemathesis run (tests/api/test_schemathesis.py) runs twice as long
# under "thorough".
hypothesis.settings.register_profile("suite", max_examples=50, deadline=None)
hypothesis.settings.register_profile("check", max_examples=10, deadline=None)
hypothesis.settings.register_profile("thorough", max_examples=1000, deadline=None)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "suite")
hypothesis.settings.load_profile(HYPOTHESIS_PROFILE)


def _redis_available() -> bool:
    if not settings.REDIS_URL:
        return False
    import redis

    try:
        return bool(redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2).ping())
    except redis.RedisError:
        return False


# Whole directories of tests that start real processes, and of those whose timeouts
# measure the product's servers, workers and agents; modules elsewhere are marked
# `processes` (and `serial`) themselves.
PROCESS_DIRECTORIES = {"e2e", "browser", "faults", "packaging"}
SERIAL_DIRECTORIES = {"e2e", "browser", "faults"}


def pytest_collection_modifyitems(items):
    """Tests that start real processes are marked `processes` (`make check` leaves them
    to `make test`). Those marked `serial` run one at a time on one xdist worker
    (`--dist loadgroup`): each starts servers, workers or agents and waits on them
    with the product's own timeouts, and two at once on two cores make those the
    machine's, not the product's. The other process tests (the CLI against a
    server, packaging, benchmark scripts, schemathesis) run on any free worker."""
    for item in items:
        if item.path.parent.name in PROCESS_DIRECTORIES:
            item.add_marker(pytest.mark.processes)
        if item.path.parent.name in SERIAL_DIRECTORIES:
            item.add_marker(pytest.mark.serial)
        if item.get_closest_marker("serial"):
            item.add_marker(pytest.mark.xdist_group("serial"))


def pytest_collection_finish(session):
    """The test process collects garbage as the web's and the worker's processes do
    (project/gc_tuning.py): what importing and collecting built is frozen, and the
    collector runs far less often than CPython's defaults over the run's heap."""
    gc_tuning.install()


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


@pytest.fixture(autouse=True, scope="session")
def _test_settings():
    """Settings for the whole run, set once:
    - a fast password hasher (fixtures make many users);
    - static files served unhashed: settings pick WhiteNoise's manifest storage, whose
      {% static %} needs the manifest `collectstatic` writes (a deploy step) once DEBUG
      is off, as it is in tests; and WhiteNoise not scanning the static directories
      each time a test client starts (no test fetches a static file through Django);
    - renders in this process: a fresh interpreter per render costs 0.1-0.4 s, and the
      child is tested in tests/configlang/test_isolated.py, by the web render's own
      test (tests/api/test_render_budget.py) and by every server an end-to-end test
      starts (their settings keep the default);
    - no API throttling unless a test sets rates (tests/api/test_throttling.py): on
      SQLite, ids are reused from test to test, so one user's counts would carry over
      within the minute."""
    override = override_settings(
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
        STORAGES={**settings.STORAGES, "staticfiles": {
            "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}},
        WHITENOISE_USE_FINDERS=False,
        BELLWETHER_RENDER_ISOLATED=False,
        BELLWETHER_THROTTLE_RATES=dict.fromkeys(settings.BELLWETHER_THROTTLE_RATES),
    )
    override.enable()
    yield
    override.disable()


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
def _fresh_kept_bundles(monkeypatch):
    """Each test starts like a new process: no bundle kept (ids are reused)."""
    from agentapi import bundle

    monkeypatch.setattr(bundle, "_kept", bundle._Kept(bundle.KEPT_MAX_BYTES))


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
def _flush_written_tables_only():
    """After a test with transactions of its own, only the tables it wrote to are
    emptied (tests/flush.py)."""
    with written_tables_only():
        yield


@pytest.fixture(autouse=True, scope="session")
def _tasks_inline():
    """Tasks run inline in tests unless a test starts a real worker."""
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = previous


@pytest.fixture(scope="session")
def _kept_chain(django_db_setup, django_db_blocker):
    """shop/prod's chain kept between tests (tests/world.py), rolled back at the end."""
    chain = KeptChain()
    yield chain
    with django_db_blocker.unblock():
        chain.prepare(())
        _end_other_sessions()


def _end_other_sessions() -> None:
    """End this worker's test database's other sessions before pytest-django drops it:
    a thread of this process (an executor of an agent route's test) may still hold one, and
    the database would stay behind with a warning."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                           " WHERE datname = current_database() AND pid <> pg_backend_pid()")


def _needs_own_transactions(item) -> bool:
    """What pytest-django runs as a TransactionTestCase (tables flushed after it)."""
    marker = item.get_closest_marker("django_db")
    transactional, reset_sequences, _, serialized_rollback, _ = (
        validate_django_db(marker) if marker else (False, False, None, False, None))
    return (transactional or reset_sequences or serialized_rollback
            or bool({"transactional_db", "live_server", "django_db_reset_sequences",
                     "django_db_serialized_rollback"} & set(item.fixturenames)))


@pytest.fixture
def _chain_prepared(request, _kept_chain, django_db_blocker):
    """Before the test's own transaction opens: the kept chain cut back or built up to
    what this test asks for (none for tests with transactions of their own)."""
    item = request.node
    wanted = () if _needs_own_transactions(item) else KeptChain.wanted(item)
    with django_db_blocker.unblock():
        _kept_chain.prepare(wanted)


@pytest.fixture
def _django_db_helper(_chain_prepared, _django_db_helper):
    """pytest-django's database access for a test, opened inside the kept chain."""
    yield


@pytest.fixture(scope="module")
def module_transaction(django_db_setup, django_db_blocker, _kept_chain):
    """An open transaction around the rest of a module's tests, for a module-scoped
    fixture that builds a world they only read or change within themselves: each test
    runs inside it in pytest-django's savepoint, rolled back after the test, and the
    world is rolled back after the module. The database stays open to the module's
    tests meanwhile. Model instances built here are shared: a test takes fresh ones
    from the database (or only ids and secrets). Not for modules with transactional
    tests (their flush would empty the world)."""
    with django_db_blocker.unblock():
        _kept_chain.prepare(())  # the chain keeps nothing while this is open
        with transaction.atomic():
            yield
            transaction.set_rollback(True)


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
def superuser(db, _kept_chain):
    return _kept_chain.kept("superuser") or factories.superuser()


@pytest.fixture
def tenant(superuser, _kept_chain):
    return _kept_chain.kept("tenant") or factories.tenant(actor=superuser)


@pytest.fixture
def application(tenant, superuser, _kept_chain):
    return _kept_chain.kept("application") or factories.application(tenant, actor=superuser)


@pytest.fixture
def environment(application, superuser, _kept_chain):
    """shop/prod: CONFIG with the nginx and app templates, nothing published."""
    return _kept_chain.kept("environment") or factories.environment(
        application, "prod", templates=factories.SHOP_TEMPLATES, actor=superuser)


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
def first(environment, superuser, _kept_chain):
    """shop/prod's snapshot #1, published and active (what agents have to begin with)."""
    snapshot = _kept_chain.kept("first")
    if snapshot is None:
        snapshot = factories.publish(environment, superuser)
        environment.refresh_from_db()
    assert (snapshot.number, snapshot.state) == (1, "ready")
    if _kept_chain.pk_of("second_active") is None:  # (else #2 is, asserted there)
        assert environment.active_snapshot_id == snapshot.pk
    return snapshot


@pytest.fixture
def second_active(first, environment, superuser, _kept_chain):
    """shop/prod's snapshot #2 (4 workers become 8), published and active."""
    snapshot = _kept_chain.kept("second_active")
    if snapshot is None:
        snapshot = build_second(environment, superuser, staged=False)
        environment.refresh_from_db()
    assert (snapshot.number, environment.active_snapshot_id) == (2, snapshot.pk)
    return snapshot


@pytest.fixture
def second_staged(first, environment, superuser, _kept_chain):
    """shop/prod's snapshot #2 (4 workers become 8), ready and NOT active: the
    environment's release policy is staged (activation is explicit)."""
    snapshot = _kept_chain.kept("second_staged")
    if snapshot is None:
        snapshot = build_second(environment, superuser, staged=True)
        environment.refresh_from_db()
    assert (snapshot.number, snapshot.state) == (2, "ready")
    assert (environment.release_policy, environment.active_snapshot_id) == ("staged", first.pk)
    return snapshot


@pytest.fixture
def processes(transactional_db):
    """Every process a test starts (tests.e2e.harness). All are stopped at teardown,
    before the database is flushed; their logs are printed (pytest shows them when
    the test fails)."""
    started = []
    yield started
    for process in reversed(started):
        process.stop()
    for process in started:
        print(process.dump())


@pytest.fixture
def running_rollout(environment, superuser):
    """shop/prod staged: #1 active, #2 rolling out, its canary web-1 of two agents."""
    from apps.releases.services import environment_update

    factories.publish(environment, superuser)
    canary, _ = factories.enrolled_agents(environment, 2, actor=superuser)
    environment_update(environment=environment, actor=superuser, release_policy="staged")
    second = factories.publish_variant(environment, superuser, workers=8)
    return factories.start_rollout(environment, second, [canary], actor=superuser)
