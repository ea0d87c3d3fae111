"""Runs a benchmark's measuring half in a child process against a fresh embedded
SQLite database in a temporary directory, and returns what it measured.

The benchmark script calls itself with --child; that half prints one line
RESULT=<json>, which run_child parses.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def report(result: dict) -> None:
    """The child's side: hand `result` to the parent."""
    print("RESULT=" + json.dumps(result))


def run_child(script: str, args: list[str], extra_env: dict | None = None) -> dict | None:
    """The parent's side: run `script --child *args` on a fresh database; None (after
    printing the child's output) when it failed."""
    workdir = tempfile.mkdtemp(prefix="bellwether-bench-")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="project.settings", DEBUG="0",
               SQLITE_PATH=os.path.join(workdir, "bench.sqlite3"), LOG_LEVEL="WARNING",
               CELERY_TASK_ALWAYS_EAGER="1", PYTHONPATH=str(ROOT), **(extra_env or {}))
    env.pop("DATABASE_URL", None)
    env["REDIS_URL"] = ""
    try:
        out = subprocess.run([sys.executable, script, "--child", *args], env=env, cwd=ROOT,
                             check=True, capture_output=True, text=True).stdout
    except subprocess.CalledProcessError as exc:
        sys.stderr.write(exc.stdout + exc.stderr)
        return None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return json.loads(next(line for line in out.splitlines()
                           if line.startswith("RESULT="))[len("RESULT="):])
