"""Runs a benchmark's measuring half in a child process against a fresh database —
embedded SQLite in a temporary directory, or, given a PostgreSQL URL, a new
database created on that server for the run and dropped after it — and returns
what it measured.

The benchmark script calls itself with --child; that half prints one line
RESULT=<json>, which run_child parses.
"""

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


def report(result: dict) -> None:
    """The child's side: hand `result` to the parent."""
    print("RESULT=" + json.dumps(result))


@contextmanager
def _fresh_postgres(database_url: str):
    """A new database on the server of `database_url` (which names a database to
    connect to for creating it), dropped afterwards; yields its URL."""
    import psycopg

    parts = urlsplit(database_url)
    name = f"{parts.path.lstrip('/') or 'postgres'}_bench_{os.getpid()}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(parts._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def run_child(script: str, args: list[str], extra_env: dict | None = None,
              database_url: str | None = None, redis_url: str | None = None) -> dict | None:
    """The parent's side: run `script --child *args` on a fresh database (SQLite, or
    PostgreSQL on the server of `database_url`), with Redis at `redis_url` as the
    cache when given; None (after printing the child's output) when it failed."""
    workdir = tempfile.mkdtemp(prefix="bellwether-bench-")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="project.settings", DEBUG="0",
               SQLITE_PATH=os.path.join(workdir, "bench.sqlite3"), LOG_LEVEL="WARNING",
               CELERY_TASK_ALWAYS_EAGER="1", PYTHONPATH=str(ROOT), **(extra_env or {}))
    env.pop("DATABASE_URL", None)
    env["REDIS_URL"] = redis_url or ""
    try:
        if database_url:
            with _fresh_postgres(database_url) as url:
                env.update(DATABASE_URL=url, SECRET_KEY=secrets.token_urlsafe(50))
                out = _run(script, args, env)
        else:
            out = _run(script, args, env)
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stdout + exc.stderr)
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return json.loads(next(line for line in out.splitlines()
                           if line.startswith("RESULT="))[len("RESULT="):])


def _run(script: str, args: list[str], env: dict) -> str:
    return subprocess.run([sys.executable, script, "--child", *args], env=env, cwd=ROOT,
                          check=True, capture_output=True, text=True).stdout
