"""The Celery application; tasks run inline in embedded mode (see settings)."""

import os

from celery import Celery
from celery.signals import (
    after_task_publish,
    beat_init,
    setup_logging,
    worker_init,
    worker_process_init,
)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

app = Celery("bellwether", task_cls="celery.contrib.django.task:DjangoTask")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


def _django_logging(**kwargs):
    """The worker and beat log as the web does (settings.LOGGING) instead of in
    Celery's own format."""
    import logging.config

    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)


# Only for JSON logs: with the plain format, Celery's own lines stay as they are.
if os.environ.get("BELLWETHER_LOG_FORMAT", "").strip() == "json":
    setup_logging.connect(_django_logging, weak=False)


@worker_init.connect(weak=False)
@worker_process_init.connect(weak=False)
def _tuned_collector(**kwargs):
    """The worker's garbage collector as the web's (project/gc_tuning.py): a refill
    or a rollout step holds tens of thousands of rows' objects at once. Tuned when
    the worker starts (its solo or threads pool runs the tasks; a prefork pool's
    processes inherit it) and again in each prefork process."""
    from project import gc_tuning

    gc_tuning.install()


def _scheduler_sent(**kwargs):
    from django.db import close_old_connections

    from apps.core.scheduler import scheduler_seen

    close_old_connections()  # (beat lives long: a database restarted meanwhile)
    scheduler_seen()


@beat_init.connect(weak=False)
def _scheduler_records_its_runs(**kwargs):
    """Beat records that it runs when it starts and each time it sends periodic work
    (apps.core.scheduler): the dashboard, rollouts and /metrics say when it stops."""
    after_task_publish.connect(_scheduler_sent, weak=False)
    _scheduler_sent()
