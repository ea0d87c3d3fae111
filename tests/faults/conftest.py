"""Private services for fault tests: a Redis of the test's own on a free port, which
the test may stall (SIGSTOP/SIGCONT) or stop without touching the shared one.

A missing redis-server skips the test, and fails it under
BELLWETHER_REQUIRE_SERVICES=1 (as .ci/run sets), like the suite's other services.
"""

import os
import shutil
import signal
import subprocess
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
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(tmp_path)],
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

    def terminate(self):
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)
            self.process.terminate()
            self.process.wait(10)


@pytest.fixture
def private_redis(tmp_path):
    if shutil.which("redis-server") is None:
        message = "needs redis-server on PATH for a private Redis"
        if REQUIRE_SERVICES:
            pytest.fail(message + "; BELLWETHER_REQUIRE_SERVICES=1 forbids skipping")
        pytest.skip(message)
    server = PrivateRedis(tmp_path)
    yield server
    server.terminate()
