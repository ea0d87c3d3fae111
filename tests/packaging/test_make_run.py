"""`make run` on a port already in use (another `make run`) stops at once, saying
so, before it migrates, loads the demo or starts a scheduler."""

import socket
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_make_run_on_a_busy_port_exits_at_once_touching_nothing(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(["make", "--no-print-directory", "run", f"PORT={port}"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60,
                                env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
                                     "BELLWETHER_VAR_DIR": str(tmp_path / "var")})

    assert result.returncode != 0
    assert time.monotonic() - started < 10
    assert f"make run: 127.0.0.1:{port} is in use (another make run?)" in result.stderr
    assert "migrate" not in result.stdout + result.stderr
    assert not (tmp_path / "var").exists()  # no database made, nothing loaded
