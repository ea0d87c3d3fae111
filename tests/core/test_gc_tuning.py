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
