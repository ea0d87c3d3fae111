"""Real processes for the end-to-end tests: a Bellwether server (Daphne's runserver, or
the production server: granian serving project.asgi) on the pytest-django test
database, Celery's worker and beat, a Redis of a test's own, `python -m agent`
processes, a small JSON client for the REST API, and bounded waits.

Nothing here mocks anything: the server is `manage.py runserver`, the agents are the
agent program, and every check goes over HTTP or looks at files on disk.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from tests import ports
from tests.deployfiles import unit_command

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 20.0
SERVER_READY_S = 30.0
STOP_S = 10.0
TEMP_MARKER = ".bellwether-tmp-"  # agent/files.py: what an interrupted write leaves


def free_port() -> int:
    return ports.free_port()  # within BELLWETHER_TEST_PORTS when set


def shared_database_url() -> str:
    """The URL of the database pytest-django created, for the server to share."""
    db = connection.settings_dict
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{user}{password}@{host}{port}/{db['NAME']}"


def wait_for(probe, *, what: str, timeout: float = WAIT_S, interval: float = 0.2,
             diagnostics=None):
    """Call `probe()` until it returns (True, value); return value. On timeout fail
    with what was last observed and `diagnostics()` (process logs)."""
    deadline = time.monotonic() + timeout
    while True:
        ok, observed = probe()
        if ok:
            return observed
        if time.monotonic() >= deadline:
            extra = f"\n{diagnostics()}" if diagnostics else ""
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}; last observed: "
                        f"{observed!r}{extra}")
        time.sleep(interval)


# --- waiting for the fleet ----------------------------------------------------------


def wait_in_sync(fleet, names, number: int, timeout: float = 20.0) -> dict[str, dict]:
    """Until every named agent reported #number succeeded and the server shows it in
    sync; returns the agents as the API lists them."""

    def probe():
        agents = fleet.api.agents()
        summary = {name: (a["status"]["sync"], a["status"]["applied"],
                          a["status"]["last_status"]) for name, a in agents.items()}
        done = all(
            name in agents
            and agents[name]["status"]["sync"] == "in_sync"
            and agents[name]["status"]["applied"]["number"] == number
            and agents[name]["status"]["last_status"] == "succeeded"
            for name in names
        )
        return done, agents if done else summary

    return wait_for(probe, what=f"{', '.join(names)} in sync at #{number}", timeout=timeout,
                    diagnostics=fleet.logs)


def wait_deployment(fleet, agent_id: int, deployment_id: str, state: str) -> dict:
    def probe():
        found = {d["id"]: d for d in fleet.api.agent_deployments(agent_id)}.get(deployment_id)
        return found is not None and found["state"] == state, found

    return wait_for(probe, what=f"deployment {deployment_id} {state}", diagnostics=fleet.logs)


# --- processes ------------------------------------------------------------------------


class Process:
    """A subprocess in its own session, logging to a file that survives restarts."""

    def __init__(self, label: str, command: list[str], env: dict, log_path: Path):
        self.label = label
        self.command = command
        self.env = env
        self.log_path = log_path
        self.process: subprocess.Popen | None = None

    def start(self) -> Process:
        assert not self.running(), f"{self.label} is already running"
        with self.log_path.open("ab") as log_file:
            log_file.write(f"---- start: {' '.join(self.command)}\n".encode())
            log_file.flush()
            self.process = subprocess.Popen(
                self.command, cwd=PROJECT_ROOT, env=self.env, stdin=subprocess.DEVNULL,
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
            )
        return self

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = STOP_S) -> int | None:
        """SIGTERM its process group (commands it runs included), SIGKILL after `timeout`."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout=timeout)
        return self.process.returncode

    def _signal_group(self, sig) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def dump(self) -> str:
        return f"---- {self.label} log ({self.log_path}) ----\n{self.log()}"


class Server(Process):
    def __init__(self, *, port: int, env: dict, log_path: Path):
        command = [sys.executable, "manage.py", "runserver", f"127.0.0.1:{port}", "--noreload"]
        super().__init__(f"server :{port}", command, env, log_path)
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    @classmethod
    def production(cls, *, port: int, env: dict, log_path: Path, workers: int = 1) -> Server:
        """A node as deploy/systemd/bellwether-web@.service runs it (one worker
        unless told)."""
        server = cls(port=port, env=env, log_path=log_path)
        server.command = unit_command("bellwether-web@.service", {"%i": str(port)},
                                      BELLWETHER_WEB_WORKERS=str(workers))
        return server

    def wait_ready(self, timeout: float = SERVER_READY_S) -> Server:
        def answers():
            if not self.running():
                pytest.fail(f"{self.label} exited with {self.process.returncode}\n"
                            f"{self.dump()}")
            try:
                status, _ = http_json("GET", self.url + "/api/v1/agent/desired", timeout=2)
            except OSError as exc:
                return False, str(exc)
            return status == 401, status

        wait_for(answers, what=f"{self.label} to answer", timeout=timeout,
                 diagnostics=self.dump)
        return self


class CeleryProcess(Process):
    """`celery -A project worker|beat` as deploy/systemd's units run it; ready once
    its log shows `ready_marker`."""

    def __init__(self, label: str, command: list[str], *, env: dict, log_path: Path,
                 ready_marker: str):
        super().__init__(label, command, env, log_path)
        self.ready_marker = ready_marker

    @classmethod
    def worker(cls, *, env: dict, log_path: Path) -> CeleryProcess:
        command = unit_command("bellwether-worker.service", BELLWETHER_WORKER_CONCURRENCY="1")
        return cls("celery worker", command, env=env, log_path=log_path,
                   ready_marker=" ready.")

    @classmethod
    def beat(cls, *, env: dict, log_path: Path, state_root: Path) -> CeleryProcess:
        """Its schedule file in its state directory under `state_root` (for systemd
        /var/lib)."""
        (state_root / "bellwether-beat").mkdir(parents=True)
        command = unit_command("bellwether-beat.service", {"%S": str(state_root)})
        return cls("celery beat", command, env=env, log_path=log_path,
                   ready_marker="beat: Starting")

    def wait_ready(self, timeout: float = SERVER_READY_S) -> CeleryProcess:
        def started():
            if not self.running():
                pytest.fail(f"{self.label} exited with {self.process.returncode}\n"
                            f"{self.dump()}")
            return self.ready_marker in self.log(), None

        wait_for(started, what=f"{self.label} to start", timeout=timeout,
                 diagnostics=self.dump)
        return self


class RedisServer(Process):
    """A `redis-server` of the test's own on a free port: nothing on disk, nothing
    shared with other tests or other runs."""

    def __init__(self, *, binary: str, port: int, directory: Path):
        directory.mkdir(parents=True, exist_ok=True)
        command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no", "--dir", str(directory)]
        super().__init__(f"redis :{port}", command, dict(os.environ),
                         directory / "redis.log")
        self.port = port
        self.url = f"redis://127.0.0.1:{port}/0"

    def wait_ready(self, timeout: float = WAIT_S) -> RedisServer:
        import redis

        def pong():
            if not self.running():
                pytest.fail(f"{self.label} exited with {self.process.returncode}\n"
                            f"{self.dump()}")
            try:
                return bool(redis.Redis(port=self.port, socket_timeout=1).ping()), None
            except redis.RedisError as exc:
                return False, str(exc)

        wait_for(pong, what=f"{self.label} to answer PING", timeout=timeout,
                 diagnostics=self.dump)
        return self


class AgentProcess(Process):
    def __init__(self, *, name: str, server_url: str, root: Path, extra_args=(),
                 enrollment_token: str | None = None):
        self.name = name
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.target_dir = root / "target"
        self.state_dir = root / "state"
        self.server_url = server_url
        self.enrollment_token = enrollment_token
        self.extra_args = list(extra_args)
        env = {k: v for k, v in os.environ.items() if not k.startswith("BELLWETHER_")}
        env["PYTHONUNBUFFERED"] = "1"
        super().__init__(f"agent {name}", self._command(), env, root / "agent.log")

    def _command(self) -> list[str]:
        command = [
            sys.executable, "-m", "agent", "--server", self.server_url, "--name", self.name,
            "--target-dir", str(self.target_dir), "--state-dir", str(self.state_dir),
            "--poll-interval", "1", "--log-level", "DEBUG", *self.extra_args,
        ]
        if self.enrollment_token:
            command += ["--enrollment-token", self.enrollment_token]
        return command

    def restart_without_enrollment_token(self) -> AgentProcess:
        """Start again with only what the state directory holds (its own token)."""
        self.enrollment_token = None
        self.command = self._command()
        return self.start()

    def files(self) -> dict[str, str]:
        """Every file under the target directory: relative path -> content."""
        found = {}
        for path in sorted(self.target_dir.rglob("*")):
            if path.is_file():
                found[path.relative_to(self.target_dir).as_posix()] = path.read_text()
        return found

    def state(self) -> dict:
        return json.loads((self.state_dir / "state.json").read_text())


# --- the REST API ---------------------------------------------------------------------


def http_json(method: str, url: str, body=None, *, token: str | None = None,
              timeout: float = 10.0) -> tuple[int, object]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Accept", "application/json")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class Api:
    """An operator's REST client for one environment, with a user API token."""

    def __init__(self, server: Server, token: str, application: str, environment: str):
        self.server = server
        self.token = token
        self.env_path = f"/api/v1/environments/{application}/{environment}"

    def call(self, method: str, path: str, body=None, expect: int | None = 200):
        status, data = http_json(method, self.server.url + path, body, token=self.token)
        if expect is not None and status != expect:
            pytest.fail(f"{method} {path} answered {status}, expected {expect}: {data!r}")
        return data

    def publish(self, *, confirm: bool = False) -> dict:
        """Publish the environment's current inputs; returns the new snapshot (ready).
        `confirm`: release it even if a file goes away or the files shrink sharply
        (the degenerate-render guard)."""
        body = self.call("POST", f"{self.env_path}/publish",
                         {"confirm": True} if confirm else None, expect=201)
        assert body["state"] == "ready", body
        return body["snapshot"]

    def agents(self) -> dict[str, dict]:
        body = self.call("GET", f"{self.env_path}/agents?limit=500")
        return {agent["name"]: agent for agent in body["results"]}

    def agent_deployments(self, agent_id: int) -> list[dict]:
        return self.call("GET", f"/api/v1/agents/{agent_id}/deployments?limit=500")["results"]

    def set_mode(self, agent_id: int, mode: str) -> dict:
        return self.call("PATCH", f"/api/v1/agents/{agent_id}", {"mode": mode})

    def deploy(self, number: int, agent_ids: list[int]) -> list[dict]:
        return self.call("POST", f"{self.env_path}/snapshots/{number}/deploy",
                         {"agents": agent_ids}, expect=201)

    def snapshot_files(self, number: int) -> dict[str, str]:
        body = self.call("GET", f"{self.env_path}/snapshots/{number}")
        return {f["path"]: f["content"] for f in body["files"]}


# --- nginx ----------------------------------------------------------------------------

NGINX_MAIN_CONF = """# Written by the e2e test: everything nginx writes stays under {prefix}.
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{
    worker_connections 64;
}}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body_temp;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi_temp;
    uwsgi_temp_path {prefix}/uwsgi_temp;
    scgi_temp_path {prefix}/scgi_temp;
    # The site file the agent manages.
    include {site};
}}
"""


class Nginx:
    """A real nginx master of the test's own: its prefix directory, its main config
    (which includes the agent-managed `site` file) and the commands an agent runs."""

    def __init__(self, *, binary: str, prefix: Path, site: Path, port: int):
        self.binary = binary
        self.prefix = prefix
        self.site = site
        self.port = port
        self.url = f"http://127.0.0.1:{port}/"
        self.conf = prefix / "nginx.conf"
        self.pid_file = prefix / "nginx.pid"
        prefix.mkdir(parents=True)
        self.conf.write_text(NGINX_MAIN_CONF.format(prefix=prefix, site=site))

    def command(self, *args: str) -> str:
        # -e stderr: messages before the config is read never go to /var/log/nginx.
        return shlex.join([self.binary, *args, "-e", "stderr", "-p", str(self.prefix),
                           "-c", str(self.conf)])

    @property
    def validate_command(self) -> str:
        return self.command("-t")

    @property
    def reload_command(self) -> str:
        return self.command("-s", "reload")

    @property
    def start_command(self) -> str:
        return self.command()

    def check_config(self) -> subprocess.CompletedProcess:
        return subprocess.run(self.validate_command, shell=True, capture_output=True,
                              text=True, timeout=30)

    def master_pid(self) -> int | None:
        try:
            return int(self.pid_file.read_text().strip())
        except (FileNotFoundError, ValueError):
            return None

    def get(self) -> tuple[int | None, str]:
        """GET / -> (status, body); (None, reason) when nothing answers."""
        try:
            with urllib.request.urlopen(self.url, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except OSError as exc:
            return None, str(exc)

    def stop(self, timeout: float = STOP_S) -> None:
        """Graceful quit (SIGQUIT to the master: works whatever the config files hold
        now, unlike `nginx -s quit`), SIGKILL to the master and its workers after
        `timeout`."""
        pid = self.master_pid()
        if pid is None or not _alive(pid):
            return
        os.kill(pid, signal.SIGQUIT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.1)
        if _alive(pid):
            for worker in _children(pid):
                _kill(worker)
            _kill(pid)

    def dump(self) -> str:
        try:
            log = (self.prefix / "error.log").read_text(errors="replace")
        except FileNotFoundError:
            log = ""
        return f"---- nginx error log ({self.prefix}/error.log) ----\n{log}"


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        if os.path.isdir("/proc"):
            return False
    try:  # no /proc: ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as handle:
            return [int(child) for child in handle.read().split()]
    except FileNotFoundError:
        return []


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
