"""`celery -A project worker` whose renders are held (tests only: run as
`python -m tests.e2e.slow_render_worker <celery args>`), so a test can do something
to the worker or its broker in the middle of a render: each render first sleeps
BELLWETHER_TEST_RENDER_DELAY_S seconds, or with BELLWETHER_TEST_RENDER_GATE waits
until that file exists (at most a minute), so the test decides when it ends."""

import os
import sys
import time
from pathlib import Path

from celery.bin.celery import main
from celery.signals import worker_init

GATE_WAIT_S = 60.0


def _held(delay_s: float, gate: str) -> None:
    if not gate:
        time.sleep(delay_s)
        return
    deadline = time.monotonic() + GATE_WAIT_S
    while not Path(gate).exists() and time.monotonic() < deadline:
        time.sleep(0.05)


@worker_init.connect
def _slow_renders(**_) -> None:
    import django

    django.setup()
    from apps.releases import publishing

    render = publishing.publication_rendered
    delay_s = float(os.environ.get("BELLWETHER_TEST_RENDER_DELAY_S", "0"))
    gate = os.environ.get("BELLWETHER_TEST_RENDER_GATE", "")

    def slow_render(publication):
        _held(delay_s, gate)
        return render(publication)

    publishing.publication_rendered = slow_render


if __name__ == "__main__":
    sys.argv[0] = "celery"
    sys.exit(main())
