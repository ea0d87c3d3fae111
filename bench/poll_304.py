"""Benchmark: the agent poll's 304 on the production server against a bare Django view.

Starts, one worker process each,
  baseline  granian --interface wsgi bench.bare_django:application
            a bare Django view answering 304 (no middleware, no apps): Django's floor
  poll      granian --interface asginl project.asgi:application
            the production shape (README "Production shape"), default middleware
creates an agent with a snapshot, warms its cache entry, then alternates wrk runs
against GET /poll (matching If-None-Match) and GET /api/v1/agent/desired
(Authorization + matching If-None-Match), and prints requests/second of
each and the ratios to the baseline (target >= 1.0, stretch 2.0).

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
import urllib.error
import urllib.request
from pathlib import Path

from benchserver import granian_command

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


def granian(interface: str, target: str, port: int, env: dict) -> subprocess.Popen:
    """One granian worker process serving `target`, as production runs it."""
    return subprocess.Popen(granian_command(port, 1, interface=interface, target=target),
                            env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def wait_answering(url: str) -> None:
    for _ in range(150):
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except urllib.error.HTTPError:
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{url} never answered")


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(5)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--redis", help="REDIS_URL for the cache (default: local memory)")
    parser.add_argument("--port", type=int,
                        help="port of the production server; the baseline takes the next")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk)")

    workdir = tempfile.mkdtemp(prefix="bellwether-bench-")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="project.settings", DEBUG="0",
               SQLITE_PATH=os.path.join(workdir, "bench.sqlite3"), LOG_LEVEL="WARNING",
               CELERY_TASK_ALWAYS_EAGER="1", PYTHONPATH=str(ROOT), ALLOWED_HOSTS="127.0.0.1",
               SECRET_KEY="bench-" + "x" * 60, SECURE_COOKIES="0")
    env.pop("DATABASE_URL", None)
    env["REDIS_URL"] = args.redis or ""
    token = setup_data(env)
    port = args.port or free_port()
    base_port = port + 1 if args.port else free_port()
    servers = [granian("asginl", "project.asgi:application", port, env),
               granian("wsgi", "bench.bare_django:application", base_port,
                       {k: v for k, v in env.items() if k != "DJANGO_SETTINGS_MODULE"})]
    prod, bare = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{base_port}"
    try:
        wait_answering(f"{prod}/healthz")
        wait_answering(f"{bare}/poll")
        request = urllib.request.Request(f"{prod}/api/v1/agent/desired",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request) as response:  # warms the cache entry
            etag = response.headers["ETag"]
        poll_headers = {"Authorization": f"Bearer {token}", "If-None-Match": etag}
        baseline, poll = [], []
        for _ in range(args.rounds):
            baseline.append(wrk(f"{bare}/poll", {"If-None-Match": '"bench"'}, args.duration,
                                args.connections))
            poll.append(wrk(f"{prod}/api/v1/agent/desired", poll_headers, args.duration,
                            args.connections))
        best_base = max(baseline)
        print(f"cache: {'redis' if args.redis else 'local memory'}; "
              f"{args.rounds} x {args.duration}s, {args.connections} connections, "
              "one worker process each")
        print(f"baseline bare Django WSGI 304 req/s: {', '.join(f'{r:.0f}' for r in baseline)}")
        print(f"poll 304 production ASGI  req/s: {', '.join(f'{r:.0f}' for r in poll)}")
        print(f"ratio (best poll / best baseline): {max(poll) / best_base:.2f}")
    finally:
        for server in servers:
            stop(server)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
