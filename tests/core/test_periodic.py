"""The periodic work: publication reconcile, and embedded mode's in-process loop."""

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.releases.tasks import publication_reconcile_task
from apps.snapshots.models import Publication
from apps.snapshots.selectors import render_source_for
from project.embedded import run_due, start_periodic_loop

RECONCILE = {"reconcile": {"task": "apps.releases.tasks.publication_reconcile_task",
                           "schedule": 60.0}}


def _stuck_publication(environment, age: timedelta) -> Publication:
    publication = Publication.objects.create(
        environment=environment, source=render_source_for(environment)
    )
    Publication.objects.filter(pk=publication.pk).update(created_at=timezone.now() - age)
    return publication


def test_reconcile_renders_a_publication_whose_render_was_lost(environment):
    publication = _stuck_publication(environment, timedelta(minutes=10))

    assert publication_reconcile_task() == 1

    publication.refresh_from_db()
    assert publication.state == "ready"
    assert publication.snapshot.number == 1


def test_reconcile_leaves_recent_publications_alone(environment):
    publication = _stuck_publication(environment, timedelta(seconds=30))

    assert publication_reconcile_task() == 0

    publication.refresh_from_db()
    assert publication.state == "rendering"


def test_run_due_runs_each_entry_once_per_interval(environment):
    _stuck_publication(environment, timedelta(minutes=10))
    next_run: dict[str, float] = {}

    assert run_due(RECONCILE, next_run, now=100.0) == ["reconcile"]
    assert run_due(RECONCILE, next_run, now=159.0) == []
    assert run_due(RECONCILE, next_run, now=160.0) == ["reconcile"]
    assert Publication.objects.get().state == "ready"


def test_run_due_survives_a_failing_task():
    schedule = {"broken": {"task": "apps.releases.tasks.publication_render_task",
                           "schedule": 1.0, "args": ("not-a-uuid",)}}
    assert run_due(schedule, {}, now=0.0) == ["broken"]


@pytest.mark.django_db(transaction=True)
def test_periodic_loop_thread_renders_stuck_publication(environment):
    publication = _stuck_publication(environment, timedelta(minutes=10))
    loop = start_periodic_loop(
        schedule={"reconcile": {**RECONCILE["reconcile"], "schedule": 0.1}}, tick=0.05
    )
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            publication.refresh_from_db()
            if publication.state != "rendering":
                break
            time.sleep(0.05)
    finally:
        loop.stop()
    assert publication.state == "ready"
