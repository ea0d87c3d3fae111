"""Private services for fault tests: a Redis of the test's own on a free port, which
the test may stall (SIGSTOP/SIGCONT) or stop, and a PostgreSQL cluster of its own
(initdb, pg_ctl) it may stop and start, without touching the shared ones.

A missing redis-server or PostgreSQL binaries skip the test, and fail it under
BELLWETHER_REQUIRE_SERVICES=1 (as .ci/run sets), like the suite's other services.
"""

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from contextlib import contextmanager

import pytest
import redis

from tests.conftest import REQUIRE_SERVICES
from tests.e2e.harness import free_port


class PrivateRedis:
    def __init__(self, tmp_path):
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tmp_path
        self.start()

    def start(self):
        """Start (again: empty, as it keeps nothing on disk) on the same port."""
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=1).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline:
                    self.terminate()
                    raise
                time.sleep(0.05)

    @contextmanager
    def stalled(self):
        """Redis stops answering (its process is stopped) until the block ends."""
        os.kill(self.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.process.pid, signal.SIGCONT)

    def kill(self):
        """Redis dies (SIGKILL): nothing saved, every connection dropped at once."""
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def terminate(self):
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)


def _missing(message: str):
    if REQUIRE_SERVICES:
        pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
    pytest.skip(message)


@pytest.fixture
def private_redis(tmp_path):
    if shutil.which("redis-server") is None:
        _missing("needs redis-server on PATH for a private Redis")
    server = PrivateRedis(tmp_path)
    yield server
    server.terminate()


class PrivatePostgres:
    """A cluster in a temporary directory, run as the `postgres` user when the test
    runs as root (initdb refuses root)."""

    def __init__(self, bindir: str):
        self.bindir = bindir
        self.port = free_port()
        self.root = tempfile.mkdtemp(prefix="bw-pg-")
        self.data = os.path.join(self.root, "data")
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres")
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, os.path.join(self.bindir, tool), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)

    def start(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-w", "-l", os.path.join(self.root, "log"),
                  "-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1",
                  "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop")

    def remove(self) -> None:
        if os.path.exists(os.path.join(self.data, "postmaster.pid")):
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def private_postgres():
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        _missing("needs PostgreSQL's initdb and pg_ctl for a private cluster")
    server = PrivatePostgres(os.path.dirname(found[-1]))
    yield server
    server.remove()
