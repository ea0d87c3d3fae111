"""The benchmark scripts still run against the code they measure (tiny sizes; the
numbers themselves live in docs/benchmarks.md, never in tests)."""

import subprocess
import sys
from pathlib import Path

import pytest

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
