"""Servers for the benchmarks that speak HTTP: a fresh database with one direct
environment, web nodes (Daphne, or granian as README "Production shape" runs it),
and in the PostgreSQL + Redis shape a Celery worker and beat, all in a temporary
directory.

    with BenchServers(nodes=2, database_url=..., redis_url=..., server="granian",
                      workers=2) as servers:
        servers.setup(agents=500, template=..., config=...)   # tokens, snapshot #1
        servers.urls, servers.rss_kib(), servers.api_token, servers.enrollment_token
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPLICATION, ENVIRONMENT = "bench", "prod"

# Runs in a child with the servers' settings: an empty schema, an owner, a direct
# environment with one template, snapshot #1 published (and so active), and the
# tokens made by the management commands an operator uses.
SETUP = """
import io, json, sys
import django; django.setup()
from django.core.management import call_command
from django.contrib.auth import get_user_model
from apps.tenancy.services import tenant_create, application_create, membership_set
from apps.environments.services import environment_create, environment_file_put
from apps.releases.services import snapshot_publish
spec = json.loads(sys.argv[1])
call_command("migrate", verbosity=0)
if spec["flush"]:
    call_command("flush", interactive=False, verbosity=0)
owner = get_user_model().objects.create_user("bench", "bench@example.com", "bench-pass")
tenant = tenant_create(name="Bench", slug="bench", actor=owner)
membership_set(tenant=tenant, user=owner, role="owner", actor=owner)
app = application_create(tenant=tenant, name=spec["application"], actor=owner)
env = environment_create(application=app, name=spec["environment"], config=spec["config"],
                         poll_interval_s=spec["poll_interval_s"], actor=owner)
environment_file_put(environment=env, kind="template", path="app.conf",
                     text=spec["template"], actor=owner)
snapshot_publish(environment=env, actor=owner)
def command(*args):
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue().strip()
print("SETUP=" + json.dumps({
    "api_token": command("api_token", "create", "bench", "--name", "bench"),
    "enrollment_token": command("enrollment_token", "create",
                                spec["application"] + "/" + spec["environment"],
                                "--uses", str(spec["uses"]), "--expires", "2h")}))
"""


def free_port(ports: list[int] | None = None, taken: list[int] = ()) -> int:
    """A free port, from `ports` when given (the first one that binds, not `taken`
    by a server still starting)."""
    for port in [p for p in ports or [0] if p not in taken]:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]
    raise SystemExit(f"no free port in {ports[0]}-{ports[-1]}")


def rss_kib(pid: int) -> int:
    """The resident set of process `pid` and its children (granian's workers) in KiB
    (VmRSS of /proc/<pid>/status)."""
    total = 0
    children = Path(f"/proc/{pid}/task/{pid}/children")
    for each in [pid, *(int(c) for c in children.read_text().split())]:
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total


# README "Production shape": granian serving the ASGI application, HTTP/1.1 only
# (agents and the load balancer speak it; `--http auto` holds per connection twice
# the memory, docs/benchmarks.md "Memory per held long-poll").
def granian_command(port: int, workers: int, *, interface: str = "asginl",
                    target: str = "project.asgi:application") -> list[str]:
    return [sys.executable, "-m", "granian", "--interface", interface, "--http", "1",
            "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
            "--backlog", "4096", "--backpressure", "16384", "--http1-buffer-size", "16384",
            "--http1-header-read-timeout", "10000", "--log-level", "warning", target]


def daphne_command(port: int) -> list[str]:
    return [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
            "project.asgi:application"]


class BenchServers:
    """`nodes` web nodes (Daphne processes, or granian with `workers` processes each)
    over one fresh database: embedded SQLite (tasks inline, local-memory cache; one
    node of one process only) or PostgreSQL + Redis (the database is flushed; a
    Celery worker and beat on a queue of this run's own). With `poll_workers`, each
    node has an agent node beside it (granian with that many processes; `poll_urls`),
    where docs/operations.md's "pool for the agents" would send agents."""

    def __init__(self, *, nodes: int = 1, database_url: str = "", redis_url: str = "",
                 ports: list[int] | None = None, extra_env: dict | None = None,
                 server: str = "daphne", workers: int = 1, poll_workers: int = 0):
        if (nodes > 1 or workers > 1) and not (database_url and redis_url):
            raise SystemExit("--nodes or --workers > 1 needs --database-url and "
                             "--redis-url (web processes share the database and the cache)")
        if server not in ("daphne", "granian"):
            raise SystemExit("server: daphne or granian")
        if poll_workers and not (database_url and redis_url):
            raise SystemExit("an agent node needs --database-url and --redis-url (it shares "
                             "the database and the cache with the web nodes)")
        self.nodes, self.ports, self.server, self.workers = nodes, ports, server, workers
        self.poll_workers = poll_workers
        self.workdir = tempfile.mkdtemp(prefix="bellwether-bench-")
        self.env = dict(
            os.environ, DJANGO_SETTINGS_MODULE="project.settings", DEBUG="0",
            LOG_LEVEL="WARNING", PYTHONPATH=str(ROOT), SECRET_KEY=secrets.token_urlsafe(48),
            BELLWETHER_VAR_DIR=self.workdir, ALLOWED_HOSTS="127.0.0.1,localhost",
            SQLITE_PATH=os.path.join(self.workdir, "bench.sqlite3"),
            DATABASE_URL=database_url, REDIS_URL=redis_url,
            CELERY_TASK_DEFAULT_QUEUE=f"bench-{os.getpid()}-{secrets.token_hex(4)}",
            # Every simulated agent comes from 127.0.0.1: enrollment is anonymous and
            # would meet the per-address rate long before the fleet is enrolled.
            BELLWETHER_THROTTLE_ANON="off", BELLWETHER_THROTTLE_AGENT="off")
        # One directory for every process's counters (prometheus_client's multi-process
        # mode, as docs/operations.md sets it for several workers): any node's
        # /metrics then counts all of them.
        self.env.update(PROMETHEUS_MULTIPROC_DIR=os.path.join(self.workdir, "metrics"))
        os.mkdir(self.env["PROMETHEUS_MULTIPROC_DIR"])
        self.env.update(extra_env or {})  # may override any of the above
        if not database_url:
            self.env.update(CELERY_TASK_ALWAYS_EAGER="1")
        self.flush = bool(database_url)
        self.web: list[subprocess.Popen] = []
        self.others: list[subprocess.Popen] = []
        self.urls: list[str] = []
        self.poll_urls: list[str] = []
        self.api_token = self.enrollment_token = ""

    def setup(self, *, uses: int, config: str, template: str, poll_interval_s: int = 30):
        spec = {"flush": self.flush, "application": APPLICATION, "environment": ENVIRONMENT,
                "config": config, "template": template, "uses": uses,
                "poll_interval_s": poll_interval_s}
        result = subprocess.run([sys.executable, "-c", SETUP, json.dumps(spec)], env=self.env,
                                cwd=ROOT, capture_output=True, text=True)
        if result.returncode:
            raise SystemExit(f"setup failed:\n{result.stderr[-3000:]}")
        line = next(x for x in result.stdout.splitlines() if x.startswith("SETUP="))
        tokens = json.loads(line[len("SETUP="):])
        self.api_token, self.enrollment_token = tokens["api_token"], tokens["enrollment_token"]

    def start(self) -> None:
        for index in range(self.nodes):
            self.urls.append(self._start_web(f"web-{index}", self.web_command))
            if self.poll_workers:
                self.poll_urls.append(self._start_web(
                    f"poll-{index}", lambda port: granian_command(port, self.poll_workers)))
        if self.env["DATABASE_URL"]:
            queue = self.env["CELERY_TASK_DEFAULT_QUEUE"]
            for role, extra in (("worker", ["--pool", "solo", "-Q", queue]),
                                ("beat", ["-s", os.path.join(self.workdir, "beat")])):
                log = open(os.path.join(self.workdir, f"{role}.log"), "wb")  # noqa: SIM115
                self.others.append(subprocess.Popen(
                    [sys.executable, "-m", "celery", "-A", "project", role,
                     "-l", self.env["LOG_LEVEL"], *extra],
                    env=self.env, cwd=ROOT, stdout=log, stderr=log))
        for url in self.urls + self.poll_urls:
            self._wait_ready(url)

    def _start_web(self, name: str, command) -> str:
        taken = [int(u.rsplit(":", 1)[1]) for u in self.urls + self.poll_urls]
        port = free_port(self.ports, taken=taken)
        log = open(os.path.join(self.workdir, f"{name}.log"), "wb")  # noqa: SIM115
        self.web.append(subprocess.Popen(command(port), env=self.env, cwd=ROOT,
                                         stdout=subprocess.DEVNULL, stderr=log))
        return f"http://127.0.0.1:{port}"

    def web_command(self, port: int) -> list[str]:
        """One web node on `port`: granian with `workers` processes, or Daphne."""
        return (granian_command(port, self.workers) if self.server == "granian"
                else daphne_command(port))

    def _wait_ready(self, url: str) -> None:
        deadline = time.monotonic() + 60  # a loaded machine
        while True:
            try:
                urllib.request.urlopen(f"{url}/healthz", timeout=1).read()
                return
            except OSError:
                if time.monotonic() > deadline or any(p.poll() is not None for p in self.web):
                    raise SystemExit(f"{url} did not start; see {self.workdir}/web-*.log"
                                     ) from None
                time.sleep(0.1)

    def rss_kib(self) -> list[int]:
        """Each web node's resident set (with its workers), KiB; with agent nodes,
        web and agent node in turn."""
        return [rss_kib(p.pid) for p in self.web]

    def log_tail(self, chars: int = 2000) -> str:
        return "".join(Path(p).read_text(errors="replace")[-chars:]
                       for p in sorted(Path(self.workdir).glob("*.log")))

    def stop(self) -> None:
        for process in self.web + self.others:
            process.terminate()
        for process in self.web + self.others:
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:  # a server waiting for open connections
                process.kill()
                process.wait()

    def __enter__(self) -> BenchServers:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)
