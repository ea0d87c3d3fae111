"""What each pytest-xdist worker has of its own when tests run in parallel: a Redis
database (tests/settings.py) and a share of BELLWETHER_TEST_PORTS (tests/ports.py).
Outside xdist (one process) everything is the configured one."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

REDIS_DATABASES = 16  # Redis's default `databases`


def worker_index() -> int | None:
    """0 for gw0, 1 for gw1, ...; None outside xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def worker_count() -> int:
    return int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))


def worker_redis_url(url: str) -> str:
    """`url` with the database this worker uses: the configured one + index + 1 (in
    the path of a redis:// URL, in `?db=` of a unix:// one)."""
    index = worker_index()
    if index is None:
        return url
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    unix = parts.scheme == "unix"
    configured = query.get("db", ["0"])[0] if unix else parts.path.strip("/") or "0"
    database = int(configured) + index + 1
    if database >= REDIS_DATABASES:
        raise RuntimeError(f"REDIS_URL={url}: worker gw{index} would need Redis database "
                           f"{database}; start fewer workers or configure a lower database")
    if unix:  # urlunsplit would drop the empty host's "//"
        return f"unix://{parts.path}?{urlencode({**query, 'db': database}, doseq=True)}"
    return urlunsplit(parts._replace(path=f"/{database}"))


def worker_share(ports: range) -> range:
    """This worker's slice of `ports` (all of it outside xdist)."""
    index = worker_index()
    if index is None:
        return ports
    size = len(ports) // worker_count()
    if size == 0:
        raise RuntimeError(f"{len(ports)} ports cannot be shared by {worker_count()} workers")
    return ports[index * size:(index + 1) * size]
