"""The garbage collector of the serving processes (project/gc_tuning.py): the web
entry point and each Celery worker process freeze what they built while starting
and collect far less often than CPython's default (700, 10, 10), whose full
collections walked millions of held long-polls' objects every few thousand requests.
Each check runs in a process of its own, as the servers start."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from project import gc_tuning

pytestmark = pytest.mark.processes

ROOT = Path(__file__).resolve().parents[2]
TUNED = (gc_tuning.YOUNG_THRESHOLD, gc_tuning.MIDDLE_AFTER, gc_tuning.FULL_AFTER)


def _collector_after(code: str, tmp_path) -> tuple[tuple, int]:
    """(thresholds, frozen objects) of a fresh process once `code` ran."""
    environ = {"PATH": os.environ.get("PATH", ""), "BELLWETHER_VAR_DIR": str(tmp_path),
               "DJANGO_SETTINGS_MODULE": "project.settings"}
    result = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport gc; print(gc.get_threshold(), "
                               "gc.get_freeze_count())"],
        cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    thresholds, _, frozen = result.stdout.strip().rpartition(" ")
    return eval(thresholds), int(frozen)  # noqa: S307 - our own print of a tuple


@pytest.mark.parametrize("code", [
    "import project.asgi",
    *(f"from celery.signals import {signal}\nimport project.celery\n"
      f"import django; django.setup()\n{signal}.send(sender=None)"
      for signal in ("worker_init", "worker_process_init")),
], ids=["web", "worker", "prefork process"])
def test_a_serving_process_freezes_its_start_and_collects_rarely(tmp_path, code):
    thresholds, frozen = _collector_after(code, tmp_path)

    assert thresholds == TUNED
    assert frozen > 50_000  # Django, the URL conf, the models: never walked again


def test_a_process_that_serves_nothing_keeps_the_default(tmp_path):
    thresholds, frozen = _collector_after("import project.settings", tmp_path)

    assert (thresholds, frozen) == (_collector_after("", tmp_path)[0], 0)  # CPython's own


ARENAS_USED = """
import ctypes, threading
{setup}
kept, together = [], threading.Barrier(8)

def allocate():
    together.wait()  # all at once: each thread asks malloc for an arena
    kept.append([bytes(4000) for _ in range(200)])  # past Python's small-object allocator

threads = [threading.Thread(target=allocate) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
ctypes.CDLL(None).malloc_stats()  # one "Arena N:" block each, on stderr
"""


def _arenas_used(setup: str, tmp_path, **environ) -> int:
    environ = {"PATH": os.environ.get("PATH", ""), "BELLWETHER_VAR_DIR": str(tmp_path),
               "DJANGO_SETTINGS_MODULE": "project.settings", **environ}
    result = subprocess.run([sys.executable, "-c", ARENAS_USED.format(setup=setup)], cwd=ROOT,
                            env=environ, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return sum(line.startswith("Arena ") for line in result.stderr.splitlines())


def test_a_serving_process_shares_few_malloc_arenas_among_its_threads(tmp_path):
    assert _arenas_used("", tmp_path) > gc_tuning.MALLOC_ARENAS + 2  # glibc's own: one a thread
    assert _arenas_used("import project.asgi", tmp_path) <= gc_tuning.MALLOC_ARENAS


def test_the_environment_decides_the_arenas_when_it_says(tmp_path):
    used = _arenas_used("import project.asgi\nfrom project import gc_tuning\n"
                        "assert not gc_tuning.malloc_arenas_bounded()", tmp_path,
                        MALLOC_ARENA_MAX="4")
    assert gc_tuning.MALLOC_ARENAS < used <= 4
