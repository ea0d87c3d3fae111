"""The test run's settings: the project's own, with each pytest-xdist worker on a
Redis database of its own, so that one worker's cache flushes, Celery queues and
channel groups never reach another's (`make test` runs several workers).

Worker gwN uses the configured Redis database + N + 1; PostgreSQL databases are
pytest-django's own per worker (test_<name>_gwN), ports tests/ports.py's share of
BELLWETHER_TEST_PORTS. Servers the tests start are given project.settings and this
worker's REDIS_URL (os.environ, set here before the settings read it).
"""

import os

from tests.workers import worker_redis_url

# The configured URL, kept so that a second import (a child process that inherits
# DJANGO_SETTINGS_MODULE) derives the same worker URL from it, not from its own.
_CONFIGURED = os.environ.setdefault("BELLWETHER_TESTS_REDIS_URL", os.environ.get("REDIS_URL", ""))
if _CONFIGURED:
    os.environ["REDIS_URL"] = worker_redis_url(_CONFIGURED)

from project.settings import *  # noqa: E402, F403
