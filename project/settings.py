"""Settings, driven by environment variables.

Embedded mode (no DATABASE_URL): SQLite, in-memory channel layer, local-memory
cache and tasks run inline, so `make run` needs no services. Production mode:
DATABASE_URL (PostgreSQL) and REDIS_URL (broker, channel layer and cache).

Every variable is read through project/env.py: unset or empty gives the default,
and a value that does not parse (DEBUG=maybe, DATABASE_POOL_SIZE=ten,
BELLWETHER_MAX_FILE_BYTES=-5) raises ImproperlyConfigured naming the variable.
All of them are parsed whatever the mode, so a typo shows up before it matters.
"""

import re
import ssl
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from project.env import (
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_networks,
    env_path,
    env_rate,
    env_secret,
    env_str,
    env_url,
    invalid,
    weak_secret_key_reason,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = env_path("BELLWETHER_VAR_DIR", BASE_DIR / "var")

DATABASE_URL = env_str("DATABASE_URL")
REDIS_URL = env_url("REDIS_URL", "", schemes=("redis", "rediss", "unix"))
EMBEDDED = not DATABASE_URL

DEBUG = env_bool("DEBUG", EMBEDDED)
SECRET_KEY = env_secret("SECRET_KEY")
if SECRET_KEY is None:
    if not EMBEDDED:
        raise ImproperlyConfigured("SECRET_KEY must be set when DATABASE_URL is set")
    SECRET_KEY = "embedded-mode-only-not-a-secret"

# Host names (example.com, .example.com for subdomains, *), and origins with their
# scheme (https://example.com, https://*.example.com): a URL in ALLOWED_HOSTS or a
# bare host or a path in CSRF_TRUSTED_ORIGINS would never match a request.
ALLOWED_HOSTS = env_list(
    "ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if EMBEDDED else [],
    item=re.compile(r"[^\s/]+"), expected="a host name such as example.com, not a URL")
CSRF_TRUSTED_ORIGINS = env_list(
    "CSRF_TRUSTED_ORIGINS", [],
    item=re.compile(r"https?://[^\s/]+", re.IGNORECASE),
    expected="an origin such as https://example.com (a scheme and a host, no path)")

# Production is what serves requests by host name without DEBUG: there a weak key
# (one that could sign forged sessions) stops start-up. Tests and embedded mode
# serve no host of their own (ALLOWED_HOSTS empty, or DEBUG on).
PRODUCTION = not EMBEDDED and not DEBUG and bool(ALLOWED_HOSTS)
if PRODUCTION and (weak := weak_secret_key_reason(SECRET_KEY)):
    raise ImproperlyConfigured(
        f"SECRET_KEY is too weak for production: {weak}; generate one with "
        "`python -c 'import secrets; print(secrets.token_urlsafe(50))'`")

INSTALLED_APPS = [
    "apps.core",  # first: its runserver adds the embedded periodic loop to daphne's
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "axes",
    "csp",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_htmx",
    "template_partials",
    "channels",
    "apps.tenancy",
    "apps.environments",
    "apps.snapshots",
    "apps.audit",
    "apps.fleet",
    "apps.governance",
    "apps.rollouts",
    "apps.releases",
    "apps.webhooks",
    "apps.dashboard",
]

MIDDLEWARE = [
    "project.requestid.RequestIdMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "apps.core.handlers.UnstorableTextMiddleware",
    # Before the session and any view: an address refused for its failed
    # authentications costs nothing more (apps/core/throttling.py).
    "apps.core.throttling.FailedAuthenticationMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "apps.core.queries.StrictQueryMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "apps.core.handlers.DatabaseUnavailableMiddleware",
    # Last, as django-axes asks: it turns a locked-out sign-in into its 429 answer.
    "axes.middleware.AxesMiddleware",
]

ROOT_URLCONF = "project.urls"
ASGI_APPLICATION = "project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

SQLITE_PATH = env_str("SQLITE_PATH", str(VAR_DIR / "bellwether.sqlite3"))
DATABASE_POOL = env_bool("DATABASE_POOL", True)
DATABASE_POOL_SIZE = env_int("DATABASE_POOL_SIZE", 10, minimum=1)
CONN_MAX_AGE = env_int("CONN_MAX_AGE", 60, minimum=0)
# A database that is down answers 503 fast rather than holding requests: a new
# connection gives up after DATABASE_CONNECT_TIMEOUT_S (libpq's least is 2), a
# request waits for a pooled one at most DATABASE_POOL_TIMEOUT_S.
DATABASE_CONNECT_TIMEOUT_S = env_int("DATABASE_CONNECT_TIMEOUT_S", 2, minimum=2, maximum=30)
DATABASE_POOL_TIMEOUT_S = env_int("DATABASE_POOL_TIMEOUT_S", 1, minimum=1, maximum=30)
# HTTP requests inside Django at once per web process (the rest wait on the event
# loop, at most BELLWETHER_DJANGO_QUEUE_S, then 503): project/admission.py.
BELLWETHER_DJANGO_CONCURRENCY = env_int("BELLWETHER_DJANGO_CONCURRENCY", DATABASE_POOL_SIZE,
                                        minimum=1)
BELLWETHER_DJANGO_QUEUE_S = env_int("BELLWETHER_DJANGO_QUEUE_S", 15, minimum=1, maximum=300)
# A request's body is received whole before it queues for Django; one that takes
# longer than this is answered 408 (a slow client holds no place in Django).
BELLWETHER_BODY_RECEIVE_S = env_int("BELLWETHER_BODY_RECEIVE_S", 30, minimum=1, maximum=600)
if EMBEDDED:
    VAR_DIR.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": SQLITE_PATH,
            # IMMEDIATE serialises writers up front, so the row locks that
            # PostgreSQL gives us become a database-wide write lock here.
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
else:
    try:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL)}
    except ValueError as exc:  # an unknown scheme or a URL that does not parse
        raise invalid("DATABASE_URL", DATABASE_URL, str(exc).rstrip(".")) from None
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", DATABASE_CONNECT_TIMEOUT_S)
    if DATABASE_POOL:
        # The pool retries a lost server with a delay that doubles (1, 2, 4... s),
        # so after a long outage it would wait about as long again before trying.
        # Giving up after DATABASE_POOL_TIMEOUT_S instead leaves the next attempt
        # to the next request, which makes it at once: service resumes within
        # about a second of the database returning, however long it was down.
        DATABASES["default"]["OPTIONS"]["pool"] = {
            "min_size": 1, "max_size": DATABASE_POOL_SIZE, "timeout": DATABASE_POOL_TIMEOUT_S,
            "reconnect_timeout": DATABASE_POOL_TIMEOUT_S}
    else:
        DATABASES["default"]["CONN_MAX_AGE"] = CONN_MAX_AGE
    # Each connection is checked before use (with the pool: as it leaves it), so
    # one broken by a database restart is replaced rather than failing a request.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Every Redis connection (cache, channel layer, broker) gives up on connecting and
# on each read or write after REDIS_TIMEOUT_S seconds, so a stalled Redis never
# holds a request longer: polls fall back to the database, a live socket closes.
REDIS_TIMEOUT_S = env_int("REDIS_TIMEOUT_S", 2, minimum=2, maximum=5)
if REDIS_URL:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "bellwether",
            "OPTIONS": {"socket_connect_timeout": REDIS_TIMEOUT_S,
                        "socket_timeout": REDIS_TIMEOUT_S},
        }
    }
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "apps.core.channel_layer.RedisChannelLayer",
            # A consumer waits on Redis in blocking pops, which must end before the
            # socket's read timeout or idle sockets drop (django/channels_redis#422):
            # they wait half of it.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": REDIS_TIMEOUT_S,
                                  "socket_connect_timeout": REDIS_TIMEOUT_S}],
                       "blocking_pop_s": REDIS_TIMEOUT_S / 2,
                       "prefix": "bellwether"},
        }
    }
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: tasks are enqueued on commit; without a broker they run inline.
CELERY_BROKER_URL = REDIS_URL or "memory://localhost/"
if REDIS_URL.startswith(("redis://", "rediss://")):
    # kombu's Redis transport with channels that close even when Redis died under
    # them, so a worker outlives Redis' death (project/broker.py).
    CELERY_BROKER_TRANSPORT = "project.broker:Transport"
if REDIS_URL.startswith("rediss://"):
    # A transport named by its class is not told by the scheme to use TLS: asked
    # here, verifying Redis' certificate as redis-py does for the cache and the
    # channel layer (an ssl_cert_reqs in the URL decides for all three).
    CELERY_BROKER_USE_SSL = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
CELERY_BROKER_CONNECTION_TIMEOUT = REDIS_TIMEOUT_S
CELERY_BROKER_TRANSPORT_OPTIONS = {"socket_timeout": REDIS_TIMEOUT_S,
                                   "socket_connect_timeout": REDIS_TIMEOUT_S}
CELERY_REDIS_SOCKET_TIMEOUT = CELERY_REDIS_SOCKET_CONNECT_TIMEOUT = REDIS_TIMEOUT_S
# A message is published at most twice (one retry after a dropped connection), so
# a broker that does not answer costs a request at most two timeouts.
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 1, "interval_start": 0,
                                    "interval_step": 0.2, "interval_max": 0.2}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", not REDIS_URL)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_DEFAULT_QUEUE = env_str("CELERY_TASK_DEFAULT_QUEUE", "bellwether")
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 120, minimum=1)
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 100, minimum=1)
if CELERY_TASK_SOFT_TIME_LIMIT >= CELERY_TASK_TIME_LIMIT:
    # The soft limit is what lets a slow render finish its publication as invalid.
    raise ImproperlyConfigured(
        f"CELERY_TASK_SOFT_TIME_LIMIT ({CELERY_TASK_SOFT_TIME_LIMIT}) must be below "
        f"CELERY_TASK_TIME_LIMIT ({CELERY_TASK_TIME_LIMIT})")
# A render has limits of its own, well under a minute, so a publication whose worker
# died is known to be lost in time to render it again within a minute: a claim
# older than the hard limit (plus a margin) is dead, and beat queues the render
# again. The soft limit finishes a slow render as invalid (render_failed).
BELLWETHER_RENDER_TIME_LIMIT_S = env_int("BELLWETHER_RENDER_TIME_LIMIT_S", 30,
                                         minimum=10, maximum=40)
BELLWETHER_RENDER_SOFT_TIME_LIMIT_S = BELLWETHER_RENDER_TIME_LIMIT_S - 5
BELLWETHER_RENDER_CLAIM_S = BELLWETHER_RENDER_TIME_LIMIT_S + 5
# A publication no worker claimed this long after it was queued is queued again
# (its message was lost, or the broker refused it at commit).
BELLWETHER_RENDER_UNCLAIMED_S = 20
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_ACKS_LATE = False
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = "UTC"
# Periodic work: one `celery beat` in production; in embedded mode the same
# schedule runs in-process (project/embedded.py, started by runserver).
# Task modules beyond each app's `tasks` (autodiscovered).
CELERY_IMPORTS = ["apps.releases.scheduled"]
CELERY_BEAT_SCHEDULE = {
    "reconcile-publications": {
        "task": "apps.releases.tasks.publication_reconcile_task",
        "schedule": 10.0,
    },
    "flush-heartbeats": {
        "task": "apps.fleet.tasks.heartbeats_flush_task",
        "schedule": 30.0,
    },
    "sweep-poll-invalidations": {
        "task": "apps.fleet.tasks.poll_invalidations_sweep_task",
        "schedule": 5.0,
    },
    "reconcile-rollouts": {
        "task": "apps.rollouts.tasks.rollouts_reconcile_task",
        "schedule": 15.0,
    },
    "retention": {
        "task": "apps.releases.tasks.retention_sweep_task",
        "schedule": 600.0,
    },
    "sweep-webhooks": {
        "task": "apps.webhooks.tasks.webhooks_sweep_task",
        "schedule": 15.0,
    },
    # Scheduled releases start within this long of their time (compare-and-set).
    "start-scheduled-releases": {
        "task": "apps.releases.scheduled.scheduled_releases_start_task",
        "schedule": 10.0,
    },
}

# The longest an agent's poll with ?wait=N is held until its desired state changes
# (agentapi/longpoll.py): a larger N is served as this; 0 turns long-polling off.
# Advertised on every desired answer as `Bellwether-Long-Poll: <seconds>`.
BELLWETHER_LONG_POLL_MAX_S = env_int("BELLWETHER_LONG_POLL_MAX_S", 60, minimum=0, maximum=300)

# Reports prompt their rollout's reconcile at most once per this many seconds (one
# run after the window covers every report in it); 0 prompts once per report.
BELLWETHER_RECONCILE_COALESCE_S = env_int("BELLWETHER_RECONCILE_COALESCE_S", 1, minimum=0,
                                          maximum=60)

AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out sign-in
    "django.contrib.auth.backends.ModelBackend",
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# One static files storage whatever DEBUG says, the one production serves: WhiteNoise
# compresses and hashes the files `collectstatic` gathers into STATIC_ROOT, so their
# URLs change with their content and browsers may cache them forever. With DEBUG on
# (`make run`, the end-to-end servers) Django's manifest storage writes unhashed
# URLs and WhiteNoise serves the files from the apps' and static/ directories, so
# no collectstatic is needed. With DEBUG off a file missing from the manifest is an
# error (WHITENOISE_MANIFEST_STRICT left on): a broken deploy shows at once instead
# of serving unversioned files. The test suite runs with DEBUG off and without
# collectstatic, so tests/conftest.py swaps in Django's plain StaticFilesStorage,
# as Django's staticfiles documentation advises for manifest storages.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = DEBUG

LOGIN_URL = "dashboard:login"
LOGIN_REDIRECT_URL = "dashboard:overview"
LOGOUT_REDIRECT_URL = "dashboard:login"
CSRF_FAILURE_VIEW = "apps.dashboard.views.csrf_failure"

# The live consumer checks a socket's session again before forwarding an event once
# this many seconds passed since the last check (sign-outs through Django end the
# sockets at once); and it joins at most this many environments' groups.
BELLWETHER_LIVE_RECHECK_S = env_int("BELLWETHER_LIVE_RECHECK_S", 5, minimum=0)
BELLWETHER_LIVE_MAX_ENVIRONMENTS = env_int("BELLWETHER_LIVE_MAX_ENVIRONMENTS", 500, minimum=1)

# Reverse proxies in front of the web nodes (0: clients connect directly). Only then
# are X-Forwarded-Proto (HTTPS as the proxy saw it) and X-Forwarded-For (the
# client's address, as the nearest of them appended it) believed; otherwise a
# client could claim HTTPS, or any address to dodge its throttle.
BELLWETHER_PROXY_COUNT = env_int("BELLWETHER_PROXY_COUNT", 0, minimum=0, maximum=10)
SECURE_PROXY_SSL_HEADER = (("HTTP_X_FORWARDED_PROTO", "https") if BELLWETHER_PROXY_COUNT
                           else None)
# The peers that may be those proxies: X-Forwarded-For is believed only from a
# connection out of these networks, so a client reaching a node directly cannot
# claim another address (loopback for /metrics, a fresh one against its throttle).
BELLWETHER_TRUSTED_PROXIES = env_networks("BELLWETHER_TRUSTED_PROXIES", [
    "127.0.0.0/8", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"])

# Request bodies above this size are refused with 413 (apps.core.api).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("BELLWETHER_MAX_REQUEST_BYTES", 10 * 1024 * 1024,
                                      minimum=1)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.tenancy.authentication.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["apps.core.parsers.BoundedJSONParser"],
    "DEFAULT_RENDERER_CLASSES": [
        "rest_framework.renderers.JSONRenderer",
        "rest_framework.renderers.BrowsableAPIRenderer",
    ],
    "DEFAULT_PAGINATION_CLASS": "apps.core.pagination.BoundedLimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "apps.core.api.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Each applies to its own kind of caller (apps/core/throttling.py); the rates
    # are BELLWETHER_THROTTLE_RATES, read at each request.
    "DEFAULT_THROTTLE_CLASSES": [
        "apps.core.throttling.UserRateThrottle",
        "apps.core.throttling.AgentRateThrottle",
        "apps.core.throttling.AnonRateThrottle",
    ],
    "NUM_PROXIES": BELLWETHER_PROXY_COUNT,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Bellwether API",
    "DESCRIPTION": "Configuration rollout control plane: environments, snapshots, "
    "diffs, pending changes and rollback.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # Every operation's error answers with the error envelope (apps.core.schema).
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "apps.core.schema.error_responses"],
    "ENUM_NAME_OVERRIDES": {
        "SnapshotStateEnum": "apps.snapshots.models.Snapshot.State",
        "PublicationStateEnum": "apps.snapshots.models.Publication.State",
        "AgentModeEnum": "apps.fleet.models.Agent.Mode",
        "DeploymentStateEnum": "apps.fleet.models.Deployment.State",
        "RolloutGateEnum": "apps.rollouts.models.Rollout.Gate",
        "RolloutStateEnum": "apps.rollouts.models.Rollout.State",
        "ReleasePolicyEnum": "apps.environments.models.Environment.ReleasePolicy",
        "PlanKindEnum": "apps.governance.rules.PLAN_KINDS",
        "WindowKindEnum": "apps.governance.models.ReleaseWindow.Kind",
        "ReleaseRequestStateEnum": "apps.governance.models.ReleaseRequest.State",
        "ScheduledReleaseStateEnum": "apps.governance.models.ScheduledRelease.State",
    },
}

# Limits on what a snapshot may hold (settable per deployment), each at least 1.
BELLWETHER_LIMITS = {
    "max_config_bytes": env_int("BELLWETHER_MAX_CONFIG_BYTES", 256 * 1024, minimum=1),
    "max_config_depth": env_int("BELLWETHER_MAX_CONFIG_DEPTH", 32, minimum=1),
    "max_config_nodes": env_int("BELLWETHER_MAX_CONFIG_NODES", 100_000, minimum=1),
    "max_file_bytes": env_int("BELLWETHER_MAX_FILE_BYTES", 1024 * 1024, minimum=1),
    "max_snapshot_bytes": env_int("BELLWETHER_MAX_SNAPSHOT_BYTES", 8 * 1024 * 1024,
                                  minimum=1),
    "max_files": env_int("BELLWETHER_MAX_FILES", 500, minimum=1),
    "max_template_iterations": env_int("BELLWETHER_MAX_TEMPLATE_ITERATIONS", 1_000_000,
                                       minimum=1),
}

# Every render runs under one budget (configlang.budget): operations and sizes come
# from BELLWETHER_LIMITS, wall time from these. A render in a web request (preview,
# pending changes, a descriptor's dry run, the admin's pending changes) gets less
# time, and at most BELLWETHER_WEB_RENDERS of them run at once in a process (others
# answer 503 render_busy at once) per tenant, BELLWETHER_WEB_RENDERS_TOTAL of all
# tenants together; publish and rollback renders get more.
BELLWETHER_RENDER_SECONDS = env_int("BELLWETHER_RENDER_SECONDS", 10, minimum=1)
BELLWETHER_WEB_RENDER_SECONDS = env_int("BELLWETHER_WEB_RENDER_SECONDS", 2, minimum=1)
BELLWETHER_WEB_RENDERS = env_int("BELLWETHER_WEB_RENDERS", 2, minimum=1)
BELLWETHER_WEB_RENDERS_TOTAL = env_int("BELLWETHER_WEB_RENDERS_TOTAL", 8,
                                       minimum=BELLWETHER_WEB_RENDERS)
# Publish and rollback render in a child process with at most this much more
# address space than the worker and CPU time to match (a backstop to the budget).
BELLWETHER_RENDER_ISOLATED = env_bool("BELLWETHER_RENDER_ISOLATED", True)
BELLWETHER_RENDER_MEMORY_MB = env_int("BELLWETHER_RENDER_MEMORY_MB", 512, minimum=64)

# Bounds on rollouts, each refused with a clear error when reached (at least 1).
BELLWETHER_ROLLOUT_LIMITS = {
    "max_targets": env_int("BELLWETHER_ROLLOUT_MAX_TARGETS", 10_000, minimum=1),
    "max_active": env_int("BELLWETHER_ROLLOUT_MAX_ACTIVE", 20, minimum=1),
    "max_history": env_int("BELLWETHER_ROLLOUT_MAX_HISTORY", 200, minimum=1),
}

# Webhooks (docs/webhooks.md). Private, loopback and link-local addresses are
# refused unless allowed (tests' receivers run on 127.0.0.1; never in production
# without a reason: docs/security.md, "Webhooks").
BELLWETHER_WEBHOOKS = {
    "allow_private": env_bool("BELLWETHER_WEBHOOK_ALLOW_PRIVATE", False),
    "timeout_s": env_int("BELLWETHER_WEBHOOK_TIMEOUT_S", 5, minimum=1, maximum=30),
    # The longest a lookup of an endpoint's host name waits (registration, delivery).
    "resolve_timeout_s": env_int("BELLWETHER_WEBHOOK_RESOLVE_TIMEOUT_S", 2, minimum=1,
                                 maximum=10),
    "max_attempts": env_int("BELLWETHER_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1, maximum=20),
    "backoff_s": env_int("BELLWETHER_WEBHOOK_BACKOFF_S", 10, minimum=1, maximum=3600),
    "backoff_max_s": env_int("BELLWETHER_WEBHOOK_BACKOFF_MAX_S", 3600, minimum=1),
    "max_endpoints": env_int("BELLWETHER_WEBHOOK_MAX_ENDPOINTS", 20, minimum=1),
}

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"))
# `json`: one JSON object a line (time, level, logger, message, request_id — the
# X-Request-ID of the request or the id of the task being run, project/requestid.py).
BELLWETHER_LOG_FORMAT = env_choice("BELLWETHER_LOG_FORMAT", "plain", ("plain", "json"))
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"request_id": {"()": "project.requestid.RequestIdFilter"}},
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "pythonjsonlogger.json.JsonFormatter",
                 "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s %(request_id)s",
                 "rename_fields": {"asctime": "time", "levelname": "level",
                                   "name": "logger"}},
    },
    "handlers": {"console": {"class": "logging.StreamHandler",
                             "formatter": BELLWETHER_LOG_FORMAT,
                             "filters": ["request_id"]}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}

# GET /metrics (Prometheus, project/metrics.py): with a token set, only requests
# presenting it (Authorization: Bearer); without one, only clients in these networks.
BELLWETHER_METRICS_TOKEN = env_secret("BELLWETHER_METRICS_TOKEN")
BELLWETHER_METRICS_NETWORKS = env_networks("BELLWETHER_METRICS_NETWORKS",
                                           ["127.0.0.0/8", "::1/128"])

# API request rates, per user (tokens and sessions), per agent and per client
# address for callers not signed in (enrollment); `off` for none. An agent polls
# at most every 5 s (poll_interval_s), a few requests a cycle: far below its rate.
# `failed_auth`: API answers 401 (a bad, unknown, revoked or missing token) per
# client address; at the bound the address is refused (429) until the window ends.
BELLWETHER_THROTTLE_RATES = {
    "user": env_rate("BELLWETHER_THROTTLE_USER", "1200/minute"),
    "agent": env_rate("BELLWETHER_THROTTLE_AGENT", "600/minute"),
    "anon": env_rate("BELLWETHER_THROTTLE_ANON", "300/minute"),
    "failed_auth": env_rate("BELLWETHER_THROTTLE_FAILED_AUTH", "60/minute"),
}

# Sign-in throttling (django-axes): after AXES_FAILURE_LIMIT failed sign-ins of one
# username from one client address, that pair is refused (429) for the cool-off.
# Counted per pair, so nobody can lock a user out from elsewhere, nor everyone out
# behind one proxy address; kept in Redis (expiring), or without Redis (embedded
# mode, one process) in axes' own table.
BELLWETHER_LOGIN_FAILURE_LIMIT = env_int("BELLWETHER_LOGIN_FAILURE_LIMIT", 5, minimum=1)
AXES_FAILURE_LIMIT = BELLWETHER_LOGIN_FAILURE_LIMIT
BELLWETHER_LOGIN_COOLOFF_S = env_int("BELLWETHER_LOGIN_COOLOFF_S", 900, minimum=1)
AXES_COOLOFF_TIME = BELLWETHER_LOGIN_COOLOFF_S / 3600  # hours
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_HANDLER = ("apps.core.throttling.LoginAttemptsCacheHandler" if REDIS_URL
                else "axes.handlers.database.AxesDatabaseHandler")
AXES_CLIENT_IP_CALLABLE = "apps.core.throttling.client_ip"
AXES_LOCKOUT_CALLABLE = "apps.core.throttling.login_locked_out"
AXES_VERBOSE = False

# Content-Security-Policy (django-csp): only this origin's scripts, styles,
# images and connections (the live websocket is same-origin: 'self' covers
# ws:/wss: there), no inline script, no plugins, no framing.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'"],
        "img-src": ["'self'", "data:"],
        "font-src": ["'self'"],
        "connect-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    },
}

# Cookies only over HTTPS unless DEBUG (SECURE_COOKIES=0 for plain-HTTP set-ups);
# read whatever DEBUG says so that a typo fails in development too.
SECURE_COOKIES = env_bool("SECURE_COOKIES", True)
if not DEBUG:
    SESSION_COOKIE_SECURE = SECURE_COOKIES
    CSRF_COOKIE_SECURE = SECURE_COOKIES

# HTTPS (check --deploy): redirect plain HTTP (not the health checks a load
# balancer sends), and HSTS when the site is HTTPS only.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)
