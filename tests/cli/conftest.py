"""Fixtures for the CLI tests: a live Bellwether server process (embedded mode:
its own SQLite file, tasks inline, reconcile in-process) holding the demo, the
CLI run as a subprocess (`python -m cli`, what the `bellwether` script runs)
or in-process (`cli.main.main`), and real `python -m agent` processes.

The server's database is built once per session (migrate, the demo, tokens:
tests/cli/seed.py) and copied for each server, so tests never share state they
change unless they share a server: read-only tests share one per module,
rollout tests start their own. The server does not use the test database: the
CLI is a client, and this runs the same with or without PostgreSQL.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cli.main import main as cli_main
from tests.e2e.harness import PROJECT_ROOT, AgentProcess, Server, free_port

CLI_TIMEOUT_S = 180


def embedded_environ(database: Path, var_dir: Path) -> dict:
    environ = {k: v for k, v in os.environ.items()
               if k not in ("DATABASE_URL", "REDIS_URL") and not k.startswith("BELLWETHER_")}
    environ.update({"DJANGO_SETTINGS_MODULE": "project.settings", "SQLITE_PATH": str(database),
                    "BELLWETHER_VAR_DIR": str(var_dir), "SECRET_KEY": "cli-tests-secret",
                    "PYTHONUNBUFFERED": "1", "LOG_LEVEL": "INFO"})
    return environ


@pytest.fixture(scope="session")
def demo_database(tmp_path_factory) -> tuple[Path, dict]:
    """(a template SQLite file holding the demo, the seeded secrets)."""
    where = tmp_path_factory.mktemp("cli-demo")
    database = where / "template.sqlite3"
    result = subprocess.run([sys.executable, "tests/cli/seed.py"], cwd=PROJECT_ROOT,
                            env=embedded_environ(database, where), capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return database, json.loads(result.stdout.strip().splitlines()[-1])


@dataclass
class Live:
    """A running server with the demo, and ways to run the CLI against it."""

    server: Server
    secrets: dict
    home: Path
    agents: dict = field(default_factory=dict)
    processes: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def environ(self, token: str | None = "deployer", **extra) -> dict:
        """The CLI's environment: this server, a token (a seeded one by its name, or
        a literal), and a HOME of its own so no real config file is read."""
        environ = {k: v for k, v in os.environ.items() if not k.startswith("BELLWETHER_")}
        environ.update({"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"),
                        "BELLWETHER_URL": self.url, "COLUMNS": "200"})
        if token is not None:
            environ["BELLWETHER_TOKEN"] = self.secrets.get(token, token)
        environ.update(extra)
        return environ

    def run(self, *args: str, token: str | None = "deployer", timeout: float = CLI_TIMEOUT_S,
            **extra) -> subprocess.CompletedProcess:
        """`python -m cli ARGS` as a subprocess (what the `bellwether` script runs)."""
        return subprocess.run([sys.executable, "-m", "cli", *args], cwd=PROJECT_ROOT,
                              env=self.environ(token, **extra), capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def json(self, *args: str, **options):
        """Run with --output json; the exit code must be 0; the parsed document."""
        result = self.run(*args, "--output", "json", **options)
        assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
        return json.loads(result.stdout)

    def call(self, *args: str, token: str | None = "deployer", **extra) -> tuple[int, str, str]:
        """cli.main.main in this process: (exit code, stdout, stderr)."""
        stdout, stderr = io.StringIO(), io.StringIO()
        code = cli_main(list(args), environ=self.environ(token, **extra), stdout=stdout,
                        stderr=stderr)
        return code, stdout.getvalue(), stderr.getvalue()

    def start_agent(self, name: str, *extra_args: str) -> AgentProcess:
        agent = AgentProcess(name=name, server_url=self.url, root=self.home / "agents" / name,
                             extra_args=extra_args, enrollment_token=self.secrets["enroll_prod"])
        self.processes.append(agent)
        self.agents[name] = agent
        return agent.start()

    def wait_agents_at(self, names: list[str], number: int, timeout: float = 60) -> dict:
        """Until each named shop/prod agent applied #number; {name: agent}."""
        deadline = time.monotonic() + timeout
        while True:
            found = {a["name"]: a for a in self.json("agents", "shop/prod")}
            if all(found.get(n, {}).get("status", {}).get("applied", {}) and
                   found[n]["status"]["applied"]["number"] == number for n in names):
                return found
            if time.monotonic() > deadline:
                logs = "\n".join(p.dump() for p in self.processes)
                pytest.fail(f"agents {names} not at #{number}: {found}\n{logs}")
            time.sleep(0.5)


def start_live(demo_database, where: Path, monkeypatch=None) -> Live:
    template, secrets = demo_database
    where.mkdir(parents=True, exist_ok=True)
    database = where / "bellwether.sqlite3"
    shutil.copyfile(template, database)
    server = Server(port=free_port(), env=embedded_environ(database, where),
                    log_path=where / "server.log")
    live = Live(server=server, secrets=secrets, home=where / "home")
    live.home.mkdir()
    live.processes.append(server)
    server.start().wait_ready()
    return live


def stop_live(live: Live) -> None:
    for process in reversed(live.processes):
        process.stop()
    for process in live.processes:
        print(process.dump())


@pytest.fixture(scope="module")
def shared_live(demo_database, tmp_path_factory):
    """One server for a module's tests that change nothing another test reads."""
    live = start_live(demo_database, tmp_path_factory.mktemp("cli-shared"))
    yield live
    stop_live(live)


@pytest.fixture
def live(demo_database, tmp_path, monkeypatch):
    """A server of this test's own (for rollouts and agents)."""
    monkeypatch.setenv("SHOP_DB_PASSWORD", "example")  # the demo's secret, for agents
    live = start_live(demo_database, tmp_path / "live")
    yield live
    stop_live(live)
