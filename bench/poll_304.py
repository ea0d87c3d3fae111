"""Benchmark: the agent poll's 304 path against a plain Django view, same server.

Starts one Daphne process (the project's ASGI app, default middleware), creates an
agent with a snapshot, warms its cache entry, then alternates wrk runs against
  baseline  GET /healthz                   (a plain Django view)
  poll      GET /api/v1/agent/desired      (Authorization + matching If-None-Match)
and prints requests/second of each and the ratio poll / baseline (target >= 0.8).

    .venv/bin/python bench/poll_304.py [--duration 10] [--rounds 3] [--connections 32]
        [--redis redis://127.0.0.1:6379/9] [--port N]

Needs wrk (apt-get install wrk). Without --redis the cache is local memory
(embedded mode); with it, the 304 path reads Redis as in production.
"""

import argparse
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_data(env: dict) -> str:
    """Migrate a fresh SQLite database and create an environment, a snapshot and an
    agent; returns the agent's token."""
    script = """
import django; django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from apps.tenancy.services import tenant_create, application_create
from apps.environments.services import environment_create, environment_file_put
from apps.releases.services import snapshot_publish
from apps.fleet.enrollment import enrollment_token_create, agent_enroll
from django.utils import timezone
from datetime import timedelta
call_command("migrate", verbosity=0)
admin = get_user_model().objects.create_superuser("bench", "b@example.com", "bench-pass")
tenant = tenant_create(name="Bench", slug="bench", actor=admin)
app = application_create(tenant=tenant, name="bench", actor=admin)
env = environment_create(application=app, name="prod", config="greeting: hello\\n", actor=admin)
environment_file_put(environment=env, kind="template", path="app.conf",
                     text="greeting = {{ greeting }}\\n", actor=admin)
snapshot_publish(environment=env, actor=admin)
_, secret = enrollment_token_create(environment=env, max_uses=1, actor=admin,
                                    expires_at=timezone.now() + timedelta(hours=1))
_, token = agent_enroll(enrollment_token=secret, name="bench-agent", labels={})
print("TOKEN=" + token)
"""
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return re.search(r"TOKEN=(\S+)", out)[1]


def wrk(url: str, headers: dict, duration: int, connections: int) -> float:
    command = ["wrk", "-t2", f"-c{connections}", f"-d{duration}s", "--latency"]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    out = subprocess.run(command + [url], capture_output=True, text=True, check=True).stdout
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if non_2xx:
        raise SystemExit(f"{url}: {non_2xx[1]} error responses\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--redis", help="REDIS_URL for the cache (default: local memory)")
    parser.add_argument("--port", type=int, help="port for the Daphne server (default: a free one)")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk)")

    workdir = tempfile.mkdtemp(prefix="bellwether-bench-")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="project.settings", DEBUG="0",
               SQLITE_PATH=os.path.join(workdir, "bench.sqlite3"), LOG_LEVEL="WARNING",
               CELERY_TASK_ALWAYS_EAGER="1", PYTHONPATH=str(ROOT))
    env.pop("DATABASE_URL", None)
    env["REDIS_URL"] = args.redis or ""
    token = setup_data(env)
    port = args.port or free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
         "project.asgi:application"],
        env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"{base}/healthz", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        request = urllib.request.Request(f"{base}/api/v1/agent/desired",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request) as response:  # warms the cache entry
            etag = response.headers["ETag"]
        poll_headers = {"Authorization": f"Bearer {token}", "If-None-Match": etag}
        baseline, poll = [], []
        for _ in range(args.rounds):
            baseline.append(wrk(f"{base}/healthz", {}, args.duration, args.connections))
            poll.append(wrk(f"{base}/api/v1/agent/desired", poll_headers, args.duration,
                            args.connections))
        best_base, best_poll = max(baseline), max(poll)
        print(f"cache: {'redis' if args.redis else 'local memory'}; "
              f"{args.rounds} x {args.duration}s, {args.connections} connections, "
              "one Daphne process")
        print(f"baseline GET /healthz      req/s: {', '.join(f'{r:.0f}' for r in baseline)}")
        print(f"poll 304 GET /agent/desired req/s: {', '.join(f'{r:.0f}' for r in poll)}")
        print(f"ratio (best poll / best baseline): {best_poll / best_base:.2f}")
    finally:
        server.terminate()
        try:
            server.wait(5)
        except subprocess.TimeoutExpired:  # Daphne waits for open connections
            server.kill()
            server.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
