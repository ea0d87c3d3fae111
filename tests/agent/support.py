"""Helpers for the agent's unit tests: bundles with right (or wrong) checksums, a
look at a directory tree, small shell scripts as commands, a crash in a real
process, and a local HTTP server that speaks the agent protocol."""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import agent
from agent.apply import content_checksum
from agent.files import TEMP_MARKER
from tests import ports

REPO_ROOT = str(Path(agent.__file__).resolve().parent.parent)


# --- bundles and trees ------------------------------------------------------------


def entries(files: dict) -> list:
    return [{"path": path, "content": content} for path, content in files.items()]


SEALED = re.compile(r"\$\{secret:sealed:[0-9a-f]{32}:([^}]+)\}")
LEGACY = object()


def sealed(reference: str, token: str = "5e" * 16) -> str:
    """A placeholder as the server's renderer makes it (configlang/secrets.py)."""
    return "${secret:sealed:" + token + ":" + reference + "}"


def manifest_of(files: dict) -> list:
    """The manifest the server would send: every sealed placeholder in `files`."""
    found: dict = {}
    for path, content in files.items():
        for match in SEALED.finditer(content):
            found.setdefault(match.group(0), (match.group(1), set()))[1].add(path)
    return [{"placeholder": p, "reference": r, "files": sorted(paths)}
            for p, (r, paths) in sorted(found.items())]


def make_bundle(number: int, files: dict, *, fallback: dict | None = None,
                checksum: str | None = None, label: str | None = None,
                secrets=None, secret_file_mode=None) -> dict:
    """A bundle; its secrets manifest lists the sealed placeholders in `files`
    unless `secrets` gives one (LEGACY: a bundle from before manifests); with the
    environment's `secret_file_mode` ("0640") when given."""
    listed = entries(files)
    bundle = {
        "number": number,
        "label": label or f"20250101-{number:03d}",
        "checksum": checksum or content_checksum(listed, secret_file_mode),
        "files": listed,
    }
    if secret_file_mode is not None:
        bundle["secret_file_mode"] = secret_file_mode
    if secrets is not LEGACY:
        bundle["secrets"] = manifest_of(files) if secrets is None else secrets
    if fallback is not None:
        bundle["fallback_files"] = entries(fallback)
    return bundle


def tree(root) -> dict:
    """{relative path: bytes} of every file under `root`."""
    root = Path(root)
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def text_tree(root) -> dict:
    return {path: data.decode("utf-8") for path, data in tree(root).items()}


def temp_files(*roots) -> list:
    found = []
    for root in roots:
        for directory, _, names in os.walk(root):
            found += [os.path.join(directory, n) for n in names if TEMP_MARKER in n]
    return found


# --- commands ----------------------------------------------------------------------


def script(tmp_path, name: str, body: str) -> str:
    """A shell script in tmp_path (outside the target directory); returns the command."""
    path = Path(tmp_path) / "scripts" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # Commands do not run in the target directory: $T names it for short.
    path.write_text('T="$BELLWETHER_TARGET_DIR"\n' + body)
    return f"sh {shlex.quote(str(path))}"


def counting(tmp_path, name: str, *, exit_code: int = 0) -> tuple:
    """A command that appends its BELLWETHER_SNAPSHOT to a log; returns (command, log)."""
    log = Path(tmp_path) / f"{name}.log"
    command = script(tmp_path, f"{name}.sh",
                     f'echo "$BELLWETHER_SNAPSHOT" >> {shlex.quote(str(log))}\n'
                     f"exit {exit_code}\n")
    return command, log


def runs(log: Path) -> list:
    return log.read_text().split() if log.exists() else []


def closed_port() -> int:
    return ports.free_port()  # nothing listens there


def agent_env(**extra) -> dict:
    """The environment for `python -m agent`: no BELLWETHER_* from the outside."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BELLWETHER_")}
    env["PYTHONPATH"] = REPO_ROOT
    env.update(extra)
    return env


# --- a crash in a real process ---------------------------------------------------------

APPLY_IN_A_PROCESS = """
import json, sys
from agent.apply import Applier, Commands
from agent.state import State, state_path
target, state_dir, bundle_file, validate, reload = sys.argv[1:6]
path = state_path(state_dir)
state = State.load(path)
applier = Applier(target_dir=target, state_dir=state_dir,
                  commands=Commands(validate=validate, reload=reload or None),
                  save=lambda s: s.save(path))
with open(bundle_file) as handle:
    bundle = json.load(handle)
print(applier.apply(bundle, state).status)
"""


def apply_in_a_process(tmp_path, target, state_dir, bundle: dict, *, validate: str,
                       reload: str = "") -> subprocess.CompletedProcess:
    bundle_file = Path(tmp_path) / f"bundle-{bundle['number']}.json"
    bundle_file.write_text(json.dumps(bundle))
    return subprocess.run(
        [sys.executable, "-c", APPLY_IN_A_PROCESS, str(target), str(state_dir),
         str(bundle_file), validate, reload],
        cwd=REPO_ROOT, env=agent_env(), capture_output=True, text=True, timeout=30,
    )


# --- a local server speaking the agent protocol ------------------------------------------


class ProtocolServer:
    """The server side of the agent protocol (docs/design.md), in a thread on 127.0.0.1.

    Tests set `desired` (or call `publish`/`push`), read what agents sent from
    `reports` (every POST body, accepted or not) and `requests`, and inject
    answers with `fail(route, status)` (`"drop"` closes the connection unanswered).
    """

    TOKEN = "bwa_test.secret"
    ENROLLMENT_TOKEN = "bwe_test"

    def __init__(self):
        self.token = self.TOKEN
        self.desired = {"snapshot": None, "deployment_id": None, "mode": "auto_pull",
                        "poll_interval_s": 10}
        self.bundles: dict[int, dict] = {}
        self.reports: list[dict] = []  # every report POSTed, answered or not
        self.drift_reports: list[dict] = []  # every drift report POSTed, answered or not
        self.accepted: list[dict] = []  # reports answered 201 (new) or 200 (duplicate)
        self.requests: list[tuple] = []
        self.enrolled: list[dict] = []
        self.failures = collections.defaultdict(list)
        self.etag_header = "ETag"
        self.raw_desired: bytes | None = None
        # Long-polling: advertised as Bellwether-Long-Poll when set; a poll with
        # ?wait=N and a matching If-None-Match is held until `desired` changes or N
        # seconds pass (or answered at once with `hold` False).
        self.long_poll_s: int | None = None
        self.hold = True
        self._push_reports: dict = {}
        self._last_pull = None
        self._httpd = None
        self.port = None
        self.lock = threading.Lock()
        # What a gzip bundle answer holds (tests replace it with broken bodies).
        self.gzip_body = lambda bundle: gzip.compress(json.dumps(bundle).encode())

    # test-facing ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ProtocolServer:
        httpd = ports.serve_in_thread(_handler_for(self), self.port)
        self.port = httpd.server_address[1]
        self._httpd = httpd
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def publish(self, bundle: dict, *, deployment_id: str | None = None,
                announced_checksum: str | None = None) -> dict:
        self.bundles[bundle["number"]] = bundle
        self.desired = dict(self.desired, deployment_id=deployment_id, snapshot={
            "number": bundle["number"], "label": bundle["label"],
            "checksum": announced_checksum or bundle["checksum"],
            "bundle_url": f"/api/v1/agent/snapshots/{bundle['number']}/bundle",
        })
        return bundle

    def fail(self, route: str, *answers) -> None:
        self.failures[route].extend(answers)

    def etag(self) -> str:
        digest = hashlib.sha256(json.dumps(self.desired, sort_keys=True).encode()).hexdigest()
        return f'"{digest[:40]}"'

    def calls(self, route: str) -> list:
        return [r for r in self.requests if r[2] == route]

    # protocol -----------------------------------------------------------------------

    def _report(self, body: dict) -> tuple:
        deployment_id = body.get("deployment_id")
        payload = (body["snapshot"], body["checksum"], body["status"], body["message"])
        if deployment_id:
            known = self._push_reports.get(deployment_id)
            if known is None:
                self._push_reports[deployment_id] = payload
                return 201, {"deployment_id": deployment_id, "state": body["status"],
                             "duplicate": False}
            if known == payload:
                return 200, {"deployment_id": deployment_id, "state": body["status"],
                             "duplicate": True}
            return 409, {"error": {"code": "report_conflict", "message": "already reported"}}
        duplicate = self._last_pull == payload
        self._last_pull = payload
        return (200 if duplicate else 201), {"deployment_id": "pull", "state": body["status"],
                                             "duplicate": duplicate}


def _error(code: str, message: str) -> dict:
    return {"error": {"code": code, "message": message}}


def _handler_for(server: ProtocolServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status: int, body=None, headers=()):
            data = body if isinstance(body, bytes) else (
                b"" if body is None else json.dumps(body).encode())
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            if status != 304:
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if status != 304:
                self.wfile.write(data)

        def _route(self) -> str:
            path = self.path.split("?")[0]
            if path == "/api/v1/agent/enroll":
                return "enroll"
            if path == "/api/v1/agent/desired":
                return "desired"
            if path == "/api/v1/agent/reports":
                return "reports"
            if path == "/api/v1/agent/drift":
                return "drift"
            if path.startswith("/api/v1/agent/snapshots/") and path.endswith("/bundle"):
                return "bundle"
            return "unknown"

        def _held(self, etag: str) -> str:
            """Hold a long-poll (?wait=N) while the desired state is `etag`; the
            ETag at the end."""
            query = self.path.partition("?")[2]
            if not (server.long_poll_s and server.hold and query.startswith("wait=")
                    and self.headers.get("If-None-Match") == etag):
                return etag
            deadline = time.monotonic() + int(query[len("wait="):])
            while server.etag() == etag and time.monotonic() < deadline:
                time.sleep(0.02)
            return server.etag()

        def _handle(self, method: str):
            route = self._route()
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            with server.lock:
                server.requests.append((method, self.path, route, dict(self.headers), body))
                injected = server.failures[route].pop(0) if server.failures[route] else None
            if route == "reports" and body is not None:
                server.reports.append(body)
            if route == "drift" and body is not None:
                server.drift_reports.append(body)
            if injected == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            if injected is not None:
                return self._answer(injected, _error("injected", f"injected {injected}"))
            if route == "unknown":
                return self._answer(404, _error("not_found", "no such route"))
            if route == "enroll":
                if body.get("enrollment_token") != server.ENROLLMENT_TOKEN:
                    return self._answer(401, _error("invalid_token", "bad enrollment token"))
                server.enrolled.append(body)
                return self._answer(201, {"agent_id": 7, "token": server.token,
                                          "environment": "shop/prod"})
            if self.headers.get("Authorization") != f"Bearer {server.token}":
                return self._answer(401, _error("invalid_token", "unknown or revoked token"))
            if route == "desired":
                etag = self._held(server.etag())
                advertised = ([("Bellwether-Long-Poll", str(server.long_poll_s))]
                              if server.long_poll_s else [])
                if self.headers.get("If-None-Match") == etag:
                    return self._answer(304, headers=[(server.etag_header, etag), *advertised])
                if server.raw_desired is not None:
                    return self._answer(200, server.raw_desired)
                return self._answer(200, server.desired,
                                    [(server.etag_header, etag), *advertised])
            if route == "bundle":
                number = int(self.path.split("/")[-2])
                bundle = server.bundles.get(number)
                if bundle is None:
                    return self._answer(404, _error("not_found", f"no snapshot {number}"))
                if "gzip" in (self.headers.get("Accept-Encoding") or ""):  # as the server
                    return self._answer(200, server.gzip_body(bundle), [
                        ("ETag", f'"{bundle["checksum"]}+gzip"'), ("Content-Encoding", "gzip")])
                return self._answer(200, bundle, [("ETag", f'"{bundle["checksum"]}"')])
            if route == "drift":
                return self._answer(200, {"recorded": True, "drifted": len(body["files"])})
            with server.lock:
                status, answer = server._report(body)
                if status in (200, 201):
                    server.accepted.append(body)
            return self._answer(status, answer)

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

    return Handler


# --- an agent running in the background ----------------------------------------------------


def alive(pid: int) -> bool:
    """Whether process `pid` runs: a zombie (dead, waiting for a parent to reap it)
    does not. /proc where there is one, else ps(1)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    if os.path.isdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                return handle.read().rpartition(")")[2].split()[0] != "Z"
        except FileNotFoundError:
            return False
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                           text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


def wait_until(condition, *, timeout: float = 30.0, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _default_signals() -> None:
    """SIGINT as a service manager leaves it: a suite started in the background (nohup,
    `make test &`) ignores it, and the agent, rightly, keeps ignoring what its parent
    ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class AgentProcess:
    """`python -m agent` in the background, in a session of its own (as a service
    manager starts it, its signals at their defaults), its stdout and stderr in files
    under `root`."""

    def __init__(self, args, root: Path, *, umask: int | None = None):
        self.root = Path(root)
        self.stdout_path = self.root / "agent.out"
        self.stderr_path = self.root / "agent.log"
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "agent", *args], cwd=REPO_ROOT, env=agent_env(),
                stdout=out, stderr=err, start_new_session=True, preexec_fn=_default_signals,
                **({} if umask is None else {"umask": umask}))
        self.pid = self.process.pid

    def log(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        wait_until(lambda: text in self.log() or self.process.poll() is not None,
                   timeout=timeout, what=f"{text!r} in the agent's log")
        assert text in self.log(), self.log()[-2000:]

    def wait(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout=timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)


def pids_in_file(pid_file: Path, count: int) -> list:
    """The pids a command wrote to `pid_file`, once it holds at least `count`."""
    wait_until(lambda: pid_file.exists() and len(pid_file.read_text().split()) >= count,
               what=f"{count} pid(s) in {pid_file.name}")
    return [int(p) for p in pid_file.read_text().split()]
