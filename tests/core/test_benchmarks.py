"""The benchmark scripts still run against the code they measure (tiny sizes; the
numbers themselves live in docs/benchmarks.md, never in tests)."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("script", "last_line"), [
    ("bench/rollout_waves.py", "ratio (per-agent loop / set-based, per agent):"),
    ("bench/overview_fleet.py", "ratio (baseline / overview):"),
])
def test_a_benchmark_runs_and_prints_both_sides_of_its_ratio(script, last_line):
    result = subprocess.run([sys.executable, script, "--agents", "30"], cwd=ROOT,
                            capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "SECRET_KEY": "bench"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1].startswith(last_line), result.stdout


def test_the_fleet_simulator_sees_every_agent_notified_and_reported():
    """bench/fleet.py at 20 agents against an embedded server it starts: enrolls them,
    waits for each to report the first snapshot, publishes, and every agent fetches
    the new bundle and reports it, with no error."""
    ports = os.environ.get("BELLWETHER_TEST_PORTS", "")
    result = subprocess.run(
        [sys.executable, "bench/fleet.py", "--agents", "20", "--interval", "0.2-0.5",
         "--ramp", "2", "--duration", "60", "--setup-timeout", "120",
         *(["--ports", ports] if ports else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "SECRET_KEY": "bench"})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    # The server advertises long-polling: every simulated agent holds its polls.
    assert lines[0] == "agents: 20 on 1 web node(s); long-poll (wait 30 s) for 20 of 20", lines
    assert any(line.startswith("publish -> notified (20/20): min ") for line in lines), lines
    assert any(line.startswith("publish -> reported (20/20): min ") for line in lines), lines
    assert any(line.startswith("server RSS (KiB, per node): before agents [") for line in lines)
    # A tenth of 20 held, then all 20: the memory of each more waiting agent.
    assert any(line.startswith("server RSS with ") and line.endswith(
        " KiB per more waiting agent") for line in lines), lines
    assert any(line.startswith("the simulator's own event-loop lag from the publish to the "
                               "last report: p50 ") for line in lines), lines
    assert any(line.startswith("CPU from the publish to the last report (") and "by process: "
               in line for line in lines), lines
    assert lines[-1] == "errors: none", lines


# .ci/run installs wrk; there (BELLWETHER_REQUIRE_SERVICES=1) a missing wrk fails.
@pytest.mark.skipif(not shutil.which("wrk") and os.environ.get("BELLWETHER_REQUIRE_SERVICES")
                    != "1", reason="needs wrk (apt-get install wrk)")
def test_the_bundle_benchmark_prints_both_rates_and_sends_the_bundle_compressed():
    ports = os.environ.get("BELLWETHER_TEST_PORTS", "")
    result = subprocess.run(
        [sys.executable, "bench/bundle_200.py", "--duration", "1", "--rounds", "1",
         "--kilobytes", "10", "--connections", "4", *(["--ports", ports] if ports else [])],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "SECRET_KEY": "bench"})
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert re.fullmatch(r"bundle: [\d.]+ KiB JSON, [\d.]+ KiB as sent \(gzip\)", lines[1]), lines
    assert lines[-1].startswith("ratio (best bundle / best poll): "), lines
