"""project/settings.py under given environments: values that do not parse raise
ImproperlyConfigured naming the variable, good ones parse, defaults hold.

The `load_settings` fixture executes the settings file afresh as a module of its own with
os.environ replaced by exactly the given variables, so the running Django
settings (django.conf.settings, sys.modules["project.settings"]) stay untouched.
"""

import importlib.util
import os
import re
import ssl
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from django.contrib.staticfiles.storage import staticfiles_storage
from django.core.exceptions import ImproperlyConfigured
from django.urls import reverse
from kombu import Connection
from whitenoise.storage import CompressedManifestStaticFilesStorage

from project.env import redact
from tests.deployfiles import environment_file

ROOT = Path(__file__).resolve().parents[2]
SETTINGS_PY = ROOT / "project" / "settings.py"
PRODUCTION = {"DATABASE_URL": "postgres://bellwether:hunter2@db:5432/bellwether",
              "SECRET_KEY": "a-production-secret"}
# Serving a host name without DEBUG: where a weak SECRET_KEY stops start-up.
STRONG_KEY = "k3y-" + "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJ"
SERVING = {**PRODUCTION, "SECRET_KEY": STRONG_KEY, "ALLOWED_HOSTS": "example.com"}
MANIFEST_STORAGE = "whitenoise.storage.CompressedManifestStaticFilesStorage"

BOOLEANS = ["DEBUG", "DATABASE_POOL", "CELERY_TASK_ALWAYS_EAGER", "SECURE_COOKIES",
            "SECURE_SSL_REDIRECT", "SECURE_HSTS_INCLUDE_SUBDOMAINS", "SECURE_HSTS_PRELOAD",
            "BELLWETHER_RENDER_ISOLATED", "BELLWETHER_WEBHOOK_ALLOW_PRIVATE"]
# Every integer variable with its default and the smallest value it accepts.
INTEGERS = {
    "DATABASE_POOL_SIZE": (10, 1),
    "CONN_MAX_AGE": (60, 0),
    "CELERY_TASK_TIME_LIMIT": (120, 1),
    "CELERY_TASK_SOFT_TIME_LIMIT": (100, 1),
    "BELLWETHER_LIVE_RECHECK_S": (5, 0),
    "BELLWETHER_LIVE_MAX_ENVIRONMENTS": (500, 1),
    "BELLWETHER_MAX_REQUEST_BYTES": (10 * 1024 * 1024, 1),
    "BELLWETHER_RENDER_SECONDS": (10, 1),
    "BELLWETHER_WEB_RENDER_SECONDS": (2, 1),
    "BELLWETHER_WEB_RENDERS": (2, 1),
    "BELLWETHER_RECONCILE_COALESCE_S": (1, 0),
    "BELLWETHER_LONG_POLL_MAX_S": (60, 0),
    "BELLWETHER_WEB_RENDERS_TOTAL": (8, 2),
    "BELLWETHER_RENDER_MEMORY_MB": (512, 64),
    "BELLWETHER_MAX_CONFIG_BYTES": (256 * 1024, 1),
    "BELLWETHER_MAX_CONFIG_DEPTH": (32, 1),
    "BELLWETHER_MAX_CONFIG_NODES": (100_000, 1),
    "BELLWETHER_MAX_FILE_BYTES": (1024 * 1024, 1),
    "BELLWETHER_MAX_SNAPSHOT_BYTES": (8 * 1024 * 1024, 1),
    "BELLWETHER_MAX_FILES": (500, 1),
    "BELLWETHER_MAX_TEMPLATE_ITERATIONS": (1_000_000, 1),
    "BELLWETHER_ROLLOUT_MAX_TARGETS": (10_000, 1),
    "BELLWETHER_ROLLOUT_MAX_ACTIVE": (20, 1),
    "BELLWETHER_ROLLOUT_MAX_HISTORY": (200, 1),
    "REDIS_TIMEOUT_S": (2, 2),
    "DATABASE_CONNECT_TIMEOUT_S": (2, 2),
    "DATABASE_POOL_TIMEOUT_S": (1, 1),
    "BELLWETHER_DJANGO_CONCURRENCY": (10, 1),
    "BELLWETHER_DJANGO_QUEUE_S": (15, 1),
    "BELLWETHER_WEBHOOK_TIMEOUT_S": (5, 1),
    "BELLWETHER_WEBHOOK_RESOLVE_TIMEOUT_S": (2, 1),
    "BELLWETHER_WEBHOOK_MAX_ATTEMPTS": (8, 1),
    "BELLWETHER_WEBHOOK_BACKOFF_S": (10, 1),
    "BELLWETHER_WEBHOOK_BACKOFF_MAX_S": (3600, 1),
    "BELLWETHER_WEBHOOK_MAX_ENDPOINTS": (20, 1),
    "BELLWETHER_BODY_RECEIVE_S": (30, 1),
    "SECURE_HSTS_SECONDS": (0, 0),
    "BELLWETHER_PROXY_COUNT": (0, 0),
    "BELLWETHER_LOGIN_FAILURE_LIMIT": (5, 1),
    "BELLWETHER_LOGIN_COOLOFF_S": (900, 1),
    "BELLWETHER_RENDER_TIME_LIMIT_S": (30, 10),
}
# Integers with a largest value too (the smallest is in INTEGERS).
MAXIMA = {"REDIS_TIMEOUT_S": 5, "DATABASE_CONNECT_TIMEOUT_S": 30,
          "DATABASE_POOL_TIMEOUT_S": 30, "BELLWETHER_PROXY_COUNT": 10,
          "BELLWETHER_RENDER_TIME_LIMIT_S": 40, "BELLWETHER_LONG_POLL_MAX_S": 300,
          "BELLWETHER_DJANGO_QUEUE_S": 300, "BELLWETHER_BODY_RECEIVE_S": 600,
          "BELLWETHER_WEBHOOK_TIMEOUT_S": 30, "BELLWETHER_WEBHOOK_RESOLVE_TIMEOUT_S": 10,
          "BELLWETHER_WEBHOOK_MAX_ATTEMPTS": 20,
          "BELLWETHER_WEBHOOK_BACKOFF_S": 3600}
# Request rates, with their defaults.
RATES = {"BELLWETHER_THROTTLE_USER": ("user", "1200/minute"),
         "BELLWETHER_THROTTLE_AGENT": ("agent", "600/minute"),
         "BELLWETHER_THROTTLE_ANON": ("anon", "300/minute"),
         "BELLWETHER_THROTTLE_FAILED_AUTH": ("failed_auth", "60/minute")}
STRINGS = ["DATABASE_URL", "REDIS_URL", "SECRET_KEY", "ALLOWED_HOSTS", "CSRF_TRUSTED_ORIGINS",
           "SQLITE_PATH", "CELERY_TASK_DEFAULT_QUEUE", "LOG_LEVEL", "BELLWETHER_VAR_DIR",
           "BELLWETHER_LOG_FORMAT", "BELLWETHER_METRICS_TOKEN", "BELLWETHER_METRICS_NETWORKS",
           "BELLWETHER_TRUSTED_PROXIES"]


@pytest.fixture
def load_settings(tmp_path):
    """load_settings(**environ) -> the settings module executed under exactly
    `environ` (None: left unset); BELLWETHER_VAR_DIR defaults to a temporary
    directory rather than the checkout's var/."""

    def load(**environ: str | None):
        environ = {"BELLWETHER_VAR_DIR": str(tmp_path / "var"), **environ}
        environ = {name: value for name, value in environ.items() if value is not None}
        spec = importlib.util.spec_from_file_location("settings_under_test", SETTINGS_PY)
        module = importlib.util.module_from_spec(spec)
        with mock.patch.dict(os.environ, environ, clear=True):
            spec.loader.exec_module(module)
        return module

    return load


def integer_setting(module, name: str) -> int:
    """Where each integer variable lands in the settings."""
    limits = {**module.BELLWETHER_LIMITS, **module.BELLWETHER_ROLLOUT_LIMITS}
    key = name.removeprefix("BELLWETHER_").removeprefix("ROLLOUT_").lower()
    if key in limits:
        return limits[key]
    if name == "BELLWETHER_MAX_REQUEST_BYTES":
        return module.DATA_UPLOAD_MAX_MEMORY_SIZE
    if key.startswith("webhook_"):
        return module.BELLWETHER_WEBHOOKS[key.removeprefix("webhook_")]
    return getattr(module, name)


def test_every_variable_read_is_tested_here_and_documented():
    read = set(re.findall(r'env_\w+\(\s*"([A-Z_]+)"', SETTINGS_PY.read_text()))
    assert read == set(BOOLEANS) | set(INTEGERS) | set(STRINGS) | set(RATES)
    documented = (ROOT / "docs" / "operations.md").read_text().split("## Settings")[1]
    assert {name for name in read if f"`{name}`" not in documented} == set()


# Booleans.

@pytest.mark.parametrize("name", BOOLEANS)
@pytest.mark.parametrize("value", ["flase", "maybe", "2", "y", "enabled"])
def test_a_boolean_that_is_not_understood_raises_naming_the_variable(load_settings, name, value):
    with pytest.raises(ImproperlyConfigured, match=f"{name}='{value}' is not valid"):
        load_settings(**{name: value})
    with pytest.raises(ImproperlyConfigured, match=f"{name}='{value}' is not valid"):
        load_settings(**PRODUCTION, **{name: value})


@pytest.mark.parametrize(("value", "expected"), [
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("On", True),
    ("false", False), ("False", False), ("0", False), ("NO", False), (" off ", False),
])
def test_booleans_accept_true_false_1_0_yes_no_on_off_in_any_case(load_settings, value, expected):
    assert load_settings(DEBUG=value).DEBUG is expected
    assert load_settings(**PRODUCTION, DEBUG=value).DEBUG is expected


def test_secure_cookies_is_checked_even_when_debug_leaves_it_unused(load_settings):
    with pytest.raises(ImproperlyConfigured, match="SECURE_COOKIES='flase'"):
        load_settings(DEBUG="1", SECURE_COOKIES="flase")


def test_secure_cookies_off_makes_cookies_plain_in_production(load_settings):
    module = load_settings(**PRODUCTION, SECURE_COOKIES="off")
    assert module.SESSION_COOKIE_SECURE is False
    assert module.CSRF_COOKIE_SECURE is False


# Integers.

@pytest.mark.parametrize("name", sorted(INTEGERS))
@pytest.mark.parametrize("value", ["ten", "-5", "abc"])
def test_an_integer_that_is_not_understood_raises_naming_the_variable(load_settings, name, value):
    with pytest.raises(ImproperlyConfigured, match=f"{name}='{value}' is not valid"):
        load_settings(**{name: value})


@pytest.mark.parametrize("value", ["1.5", "1e3", "0x10", "+5", "1_000", "12 3", "١٢"])
def test_an_integer_is_plain_decimal_digits(load_settings, value):
    with pytest.raises(ImproperlyConfigured, match="BELLWETHER_MAX_FILE_BYTES="):
        load_settings(BELLWETHER_MAX_FILE_BYTES=value)


@pytest.mark.parametrize("name", sorted(INTEGERS))
def test_an_integer_below_its_minimum_raises(load_settings, name):
    minimum = INTEGERS[name][1]
    with pytest.raises(ImproperlyConfigured, match=f"at least {minimum}"):
        load_settings(**{name: str(minimum - 1)})


@pytest.mark.parametrize("name", sorted(INTEGERS))
def test_an_integer_parses_into_its_setting(load_settings, name):
    # A hard time limit stays above the default soft one (100).
    value = {"CELERY_TASK_TIME_LIMIT": 700, "REDIS_TIMEOUT_S": 3,
             "BELLWETHER_RENDER_TIME_LIMIT_S": 17,
             "BELLWETHER_RENDER_MEMORY_MB": 700}.get(name, 7)
    module = load_settings(**{name: f" {value} "})
    assert integer_setting(module, name) == value


@pytest.mark.parametrize("name", sorted(MAXIMA))
def test_an_integer_above_its_maximum_raises(load_settings, name):
    maximum = MAXIMA[name]
    with pytest.raises(ImproperlyConfigured, match=f"at most {maximum}"):
        load_settings(**{name: str(maximum + 1)})


def test_the_database_times_out_fast_in_production(load_settings):
    module = load_settings(**PRODUCTION, DATABASE_CONNECT_TIMEOUT_S="3",
                           DATABASE_POOL_TIMEOUT_S="2")
    options = module.DATABASES["default"]["OPTIONS"]
    assert (options["connect_timeout"], options["pool"]["timeout"]) == (3, 2)
    # The pool stops retrying a lost server after as long, so the next request
    # connects at once when it is back (no backoff grown over a long outage).
    assert options["pool"]["reconnect_timeout"] == 2


def test_every_redis_client_times_out_within_redis_timeout_s(load_settings):
    module = load_settings(**PRODUCTION, REDIS_URL="redis://cache:6379/0", REDIS_TIMEOUT_S="4")
    options = module.CACHES["default"]["OPTIONS"]
    assert (options["socket_timeout"], options["socket_connect_timeout"]) == (4, 4)
    config = module.CHANNEL_LAYERS["default"]["CONFIG"]
    [host] = config["hosts"]
    assert (host["socket_timeout"], host["socket_connect_timeout"]) == (4, 4)
    # The blocking pop ends before the read would time out (channels_redis#422).
    assert config["blocking_pop_s"] < host["socket_timeout"]
    transport = module.CELERY_BROKER_TRANSPORT_OPTIONS
    assert (transport["socket_timeout"], transport["socket_connect_timeout"]) == (4, 4)
    assert module.CELERY_BROKER_CONNECTION_TIMEOUT == 4
    assert module.CELERY_REDIS_SOCKET_TIMEOUT == module.CELERY_REDIS_SOCKET_CONNECT_TIMEOUT == 4


def test_the_pool_size_and_connection_age_parse_in_production(load_settings):
    pooled = load_settings(**PRODUCTION, DATABASE_POOL_SIZE="25")
    assert pooled.DATABASES["default"]["OPTIONS"]["pool"] == {
        "min_size": 1, "max_size": 25, "timeout": 1, "reconnect_timeout": 1}
    unpooled = load_settings(**PRODUCTION, DATABASE_POOL="no", CONN_MAX_AGE="0")
    assert unpooled.DATABASES["default"]["OPTIONS"] == {"connect_timeout": 2}
    assert unpooled.DATABASES["default"]["CONN_MAX_AGE"] == 0


def test_the_soft_time_limit_must_be_below_the_hard_one(load_settings):
    with pytest.raises(ImproperlyConfigured, match="CELERY_TASK_SOFT_TIME_LIMIT"):
        load_settings(CELERY_TASK_TIME_LIMIT="100")


# Defaults.

EMBEDDED_DEFAULTS = {
    "DEBUG": True,
    "SECRET_KEY": "embedded-mode-only-not-a-secret",
    "ALLOWED_HOSTS": ["127.0.0.1", "localhost", "[::1]"],
    "CSRF_TRUSTED_ORIGINS": [],
    "REDIS_URL": "",
    "CACHES": {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
    "CHANNEL_LAYERS": {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}},
    "CELERY_BROKER_URL": "memory://localhost/",
    "CELERY_TASK_ALWAYS_EAGER": True,
    "CELERY_TASK_DEFAULT_QUEUE": "bellwether",
    "CELERY_TASK_TIME_LIMIT": 120,
    "CELERY_TASK_SOFT_TIME_LIMIT": 100,
    "BELLWETHER_RENDER_TIME_LIMIT_S": 30,
    "BELLWETHER_RENDER_SOFT_TIME_LIMIT_S": 25,
    "BELLWETHER_LIVE_RECHECK_S": 5,
    "BELLWETHER_LIVE_MAX_ENVIRONMENTS": 500,
    "DATA_UPLOAD_MAX_MEMORY_SIZE": 10 * 1024 * 1024,
    "BELLWETHER_LIMITS": {
        "max_config_bytes": 256 * 1024,
        "max_config_depth": 32,
        "max_config_nodes": 100_000,
        "max_file_bytes": 1024 * 1024,
        "max_snapshot_bytes": 8 * 1024 * 1024,
        "max_files": 500,
        "max_template_iterations": 1_000_000,
    },
    "BELLWETHER_ROLLOUT_LIMITS": {"max_targets": 10_000, "max_active": 20, "max_history": 200},
}


def assert_embedded_defaults(module):
    assert {name: getattr(module, name) for name in EMBEDDED_DEFAULTS} == EMBEDDED_DEFAULTS
    assert module.EMBEDDED is True
    assert module.VAR_DIR == ROOT / "var"
    database = module.DATABASES["default"]
    assert database["ENGINE"] == "django.db.backends.sqlite3"
    assert database["NAME"] == str(ROOT / "var" / "bellwether.sqlite3")
    assert module.LOGGING["root"]["level"] == "INFO"
    assert not hasattr(module, "SESSION_COOKIE_SECURE")  # DEBUG on: cookies not forced


def test_embedded_mode_defaults_are_unchanged(load_settings):
    assert_embedded_defaults(load_settings(BELLWETHER_VAR_DIR=None))


def test_an_empty_variable_means_its_default(load_settings):
    names = BOOLEANS + sorted(INTEGERS) + STRINGS
    assert_embedded_defaults(load_settings(**dict.fromkeys(names, "")))
    assert_embedded_defaults(load_settings(**dict.fromkeys(names, "  ")))


def test_production_defaults_are_unchanged(load_settings):
    module = load_settings(**PRODUCTION)
    assert module.EMBEDDED is False
    assert module.DEBUG is False
    assert module.SECRET_KEY == "a-production-secret"
    assert module.ALLOWED_HOSTS == []
    database = module.DATABASES["default"]
    assert (database["ENGINE"], database["HOST"], database["NAME"]) == (
        "django.db.backends.postgresql", "db", "bellwether")
    assert database["OPTIONS"] == {"connect_timeout": 2, "pool": {
        "min_size": 1, "max_size": 10, "timeout": 1, "reconnect_timeout": 1}}
    assert module.SESSION_COOKIE_SECURE is True
    assert module.CSRF_COOKIE_SECURE is True
    assert load_settings(**PRODUCTION, DATABASE_POOL="0").DATABASES["default"][
        "CONN_MAX_AGE"] == 60


@pytest.mark.parametrize("secret", [None, "", "   "])
def test_a_missing_secret_key_outside_embedded_mode_raises(load_settings, secret):
    with pytest.raises(ImproperlyConfigured, match="SECRET_KEY must be set"):
        load_settings(DATABASE_URL=PRODUCTION["DATABASE_URL"], SECRET_KEY=secret)


def test_a_secret_key_is_taken_as_set(load_settings):
    assert load_settings(**{**PRODUCTION, "SECRET_KEY": " spaced "}).SECRET_KEY == " spaced "


# URLs, lists and names.

@pytest.mark.parametrize("url", ["nosuch://db/x", "postgres://bellwether:hunter2@db:abc/x"])
def test_a_database_url_that_does_not_parse_raises_without_its_password(load_settings, url):
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL=") as raised:
        load_settings(**{**PRODUCTION, "DATABASE_URL": url})
    assert "hunter2" not in str(raised.value)


@pytest.mark.parametrize("url", ["localhost:6379", "http://redis:6379/0", "redis://"])
def test_a_redis_url_without_a_redis_scheme_raises(load_settings, url):
    with pytest.raises(ImproperlyConfigured, match="REDIS_URL="):
        load_settings(REDIS_URL=url)


def test_a_redis_url_selects_redis_and_is_never_shown_with_its_password(load_settings):
    module = load_settings(**PRODUCTION, REDIS_URL="rediss://:pw@cache:6380/2")
    assert module.CACHES["default"]["LOCATION"] == "rediss://:pw@cache:6380/2"
    assert module.CELERY_BROKER_URL == "rediss://:pw@cache:6380/2"
    assert module.CELERY_TASK_ALWAYS_EAGER is False
    assert redact("rediss://:pw@cache:6380/2") == "rediss://:***@cache:6380/2"
    assert redact("postgres://u:p@ss@db/x") == "postgres://u:***@db/x"
    assert redact("redis://cache:6379/0") == "redis://cache:6379/0"


def broker_connection(module) -> Connection:
    """The broker connection Celery makes from these settings."""
    return Connection(module.CELERY_BROKER_URL, transport=module.CELERY_BROKER_TRANSPORT,
                      ssl=getattr(module, "CELERY_BROKER_USE_SSL", False))


def test_the_broker_transport_closes_channels_and_keeps_tls_for_rediss(load_settings):
    plain = broker_connection(load_settings(**PRODUCTION, REDIS_URL="redis://cache:6379/0"))
    assert plain.transport.Channel.__module__ == "project.broker"
    assert (plain.hostname, plain.port, plain.virtual_host, plain.ssl) == (
        "cache", 6379, "0", False)
    tls = broker_connection(load_settings(**PRODUCTION, REDIS_URL="rediss://cache:6380/2"))
    assert tls.transport.Channel.__module__ == "project.broker"
    assert tls.ssl == {"ssl_cert_reqs": ssl.CERT_REQUIRED}  # as redis-py's, the cache's
    unverified = broker_connection(load_settings(
        **PRODUCTION, REDIS_URL="rediss://cache:6380/2?ssl_cert_reqs=none"))
    assert unverified.ssl == {"ssl_cert_reqs": ssl.CERT_NONE}  # the URL decides
    assert not hasattr(load_settings(), "CELERY_BROKER_TRANSPORT")  # embedded: memory://


def test_hosts_and_origins_are_comma_separated(load_settings):
    module = load_settings(ALLOWED_HOSTS=" example.com, .example.org,,",
                           CSRF_TRUSTED_ORIGINS="https://example.com, https://*.example.org")
    assert module.ALLOWED_HOSTS == ["example.com", ".example.org"]
    assert module.CSRF_TRUSTED_ORIGINS == ["https://example.com", "https://*.example.org"]


@pytest.mark.parametrize(("name", "value"), [
    ("ALLOWED_HOSTS", "example.com,https://example.com"),
    ("ALLOWED_HOSTS", "example.com/app"),
    ("CSRF_TRUSTED_ORIGINS", "example.com"),
    ("CSRF_TRUSTED_ORIGINS", "https://example.com/"),
    ("CSRF_TRUSTED_ORIGINS", "ftp://example.com"),
])
def test_a_host_or_origin_of_the_wrong_shape_raises(load_settings, name, value):
    with pytest.raises(ImproperlyConfigured, match=f"{name}=.* item"):
        load_settings(**{name: value})


def test_log_level_is_a_level_name_in_any_case(load_settings):
    assert load_settings(LOG_LEVEL="warning").LOGGING["root"]["level"] == "WARNING"
    with pytest.raises(ImproperlyConfigured, match="LOG_LEVEL='verbose'"):
        load_settings(LOG_LEVEL="verbose")


def test_importing_the_settings_fails_with_the_variable_named(tmp_path):
    """The real import path, in a process of its own: python -c 'import project.settings'."""
    environ = {"PATH": os.environ.get("PATH", ""), "BELLWETHER_VAR_DIR": str(tmp_path),
               "DATABASE_POOL_SIZE": "ten"}
    result = subprocess.run([sys.executable, "-c", "import project.settings"], cwd=ROOT,
                            env=environ, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert ("django.core.exceptions.ImproperlyConfigured: DATABASE_POOL_SIZE='ten' is not "
            "valid: expected a whole number.") in result.stderr


# Static files.

@pytest.mark.parametrize("base", [{}, PRODUCTION], ids=["embedded", "production"])
def test_static_storage_is_the_same_with_debug_on_and_off(load_settings, base):
    on = load_settings(**base, DEBUG="on")
    off = load_settings(**base, DEBUG="off")
    assert on.STORAGES == off.STORAGES
    assert on.STORAGES["staticfiles"] == {"BACKEND": MANIFEST_STORAGE}


def test_a_page_with_static_files_renders_in_tests_without_collectstatic(client, db):
    response = client.get(reverse("dashboard:login"))
    assert response.status_code == 200
    assert b'href="/static/bellwether/dashboard.css"' in response.content


def test_a_page_with_static_files_renders_with_the_manifest_storage_under_debug(
        client, db, settings):
    """`make run`: the settings' own storage, DEBUG on, no collectstatic."""
    settings.DEBUG = True
    settings.STORAGES = {**settings.STORAGES, "staticfiles": {"BACKEND": MANIFEST_STORAGE}}
    response = client.get(reverse("dashboard:login"))
    assert isinstance(staticfiles_storage, CompressedManifestStaticFilesStorage)
    assert response.status_code == 200
    assert b'href="/static/bellwether/dashboard.css"' in response.content


# Hardening: the secret key, the proxy, HTTPS, request rates.

@pytest.mark.parametrize(("key", "reason"), [
    ("a-production-secret", "19 characters, fewer than 50"),
    ("x" * 80, "1 distinct characters, fewer than 5"),
    ("django-insecure-" + STRONG_KEY, "starts with django-insecure"),
])
def test_a_weak_secret_key_stops_a_production_start(load_settings, key, reason):
    with pytest.raises(ImproperlyConfigured, match=f"SECRET_KEY is too weak for production: "
                                                   f"it (has )?{reason}"):
        load_settings(**{**SERVING, "SECRET_KEY": key})


def test_a_strong_secret_key_starts_and_a_weak_one_is_left_to_tests_and_debug(load_settings):
    assert load_settings(**SERVING).PRODUCTION is True
    weak = {**SERVING, "SECRET_KEY": "x"}
    assert load_settings(**weak, DEBUG="1").PRODUCTION is False  # DEBUG serves no one
    assert load_settings(**{**weak, "ALLOWED_HOSTS": None}).PRODUCTION is False  # tests


def test_forwarded_headers_are_believed_only_with_a_proxy_count(load_settings):
    direct = load_settings(**SERVING)
    proxied = load_settings(**SERVING, BELLWETHER_PROXY_COUNT="1")
    assert direct.SECURE_PROXY_SSL_HEADER is None
    assert direct.REST_FRAMEWORK["NUM_PROXIES"] == 0
    assert proxied.SECURE_PROXY_SSL_HEADER == ("HTTP_X_FORWARDED_PROTO", "https")
    assert proxied.REST_FRAMEWORK["NUM_PROXIES"] == 1


def test_https_settings_parse(load_settings):
    module = load_settings(**SERVING, SECURE_HSTS_SECONDS="31536000",
                           SECURE_HSTS_INCLUDE_SUBDOMAINS="on", SECURE_HSTS_PRELOAD="yes",
                           SECURE_SSL_REDIRECT="true")
    assert (module.SECURE_HSTS_SECONDS, module.SECURE_HSTS_INCLUDE_SUBDOMAINS,
            module.SECURE_HSTS_PRELOAD, module.SECURE_SSL_REDIRECT) == (31536000, True, True,
                                                                        True)
    assert module.SECURE_REDIRECT_EXEMPT == [r"^healthz$", r"^readyz$"]


@pytest.mark.parametrize("name", sorted(RATES))
def test_request_rates_parse_and_off_means_none(load_settings, name):
    scope, default = RATES[name]
    assert load_settings().BELLWETHER_THROTTLE_RATES[scope] == default
    assert load_settings(**{name: " 30/Second "}).BELLWETHER_THROTTLE_RATES[scope] == \
        "30/second"
    assert load_settings(**{name: "OFF"}).BELLWETHER_THROTTLE_RATES[scope] is None
    for value in ("30", "0/minute", "30/min", "30/fortnight", "-1/hour", "many"):
        with pytest.raises(ImproperlyConfigured, match=f"{name}='{value}' is not valid"):
            load_settings(**{name: value})


@pytest.mark.slow  # every deploy check
def test_check_deploy_passes_without_warnings_with_the_shipped_environment_file(tmp_path):
    """`manage.py check --deploy` in a process of its own, with deploy/bellwether.env
    as shipped and a strong key (Redis is not contacted by the checks)."""
    environ = {"PATH": os.environ.get("PATH", ""), "BELLWETHER_VAR_DIR": str(tmp_path),
               **environment_file(), "SECRET_KEY": STRONG_KEY,
               "REDIS_URL": "redis://127.0.0.1:1/0"}
    result = subprocess.run([sys.executable, "manage.py", "check", "--deploy",
                             "--fail-level", "WARNING"], cwd=ROOT, env=environ,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


def test_log_format_and_metrics_networks_are_checked_at_start_up(load_settings):
    module = load_settings(BELLWETHER_LOG_FORMAT="JSON",
                           BELLWETHER_METRICS_NETWORKS="10.0.0.0/8, 192.0.2.7")
    assert module.LOGGING["handlers"]["console"]["formatter"] == "json"
    assert [str(n) for n in module.BELLWETHER_METRICS_NETWORKS] == ["10.0.0.0/8",
                                                                    "192.0.2.7/32"]
    with pytest.raises(ImproperlyConfigured, match="BELLWETHER_LOG_FORMAT"):
        load_settings(BELLWETHER_LOG_FORMAT="xml")
    with pytest.raises(ImproperlyConfigured, match="BELLWETHER_METRICS_NETWORKS"):
        load_settings(BELLWETHER_METRICS_NETWORKS="10.0.0.0/33")


def test_trusted_proxies_are_private_networks_unless_named(load_settings):
    default = load_settings().BELLWETHER_TRUSTED_PROXIES
    assert "127.0.0.0/8" in [str(n) for n in default] and len(default) == 6
    module = load_settings(BELLWETHER_TRUSTED_PROXIES="198.51.100.0/24")
    assert [str(n) for n in module.BELLWETHER_TRUSTED_PROXIES] == ["198.51.100.0/24"]
    with pytest.raises(ImproperlyConfigured, match="BELLWETHER_TRUSTED_PROXIES"):
        load_settings(BELLWETHER_TRUSTED_PROXIES="proxy.example.com")
