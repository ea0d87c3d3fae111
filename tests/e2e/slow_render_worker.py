"""`celery -A project worker` whose renders first sleep BELLWETHER_TEST_RENDER_DELAY_S
seconds (tests only: run as `python -m tests.e2e.slow_render_worker <celery args>`),
so a test can kill the worker in the middle of a render."""

import os
import sys
import time

from celery.bin.celery import main
from celery.signals import worker_init


@worker_init.connect
def _slow_renders(**_) -> None:
    import django

    django.setup()
    from apps.releases import publishing

    render, delay = publishing.publication_rendered, float(
        os.environ["BELLWETHER_TEST_RENDER_DELAY_S"])

    def slow_render(publication):
        time.sleep(delay)
        return render(publication)

    publishing.publication_rendered = slow_render


if __name__ == "__main__":
    sys.argv[0] = "celery"
    sys.exit(main())
