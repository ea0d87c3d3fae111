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
    publication = _stuck_publication(environment, timedelta(seconds=10))

    assert publication_reconcile_task() == 0

    publication.refresh_from_db()
    assert publication.state == "rendering"


def test_reconcile_queues_an_unclaimed_publication_again_after_20_s(environment):
    publication = _stuck_publication(environment, timedelta(seconds=25))

    assert publication_reconcile_task() == 1

    publication.refresh_from_db()
    assert publication.state == "ready" and publication.claimed_at is not None


def _claimed(environment, claimed_ago: timedelta) -> Publication:
    publication = _stuck_publication(environment, timedelta(minutes=10))
    Publication.objects.filter(pk=publication.pk).update(
        claimed_at=timezone.now() - claimed_ago)
    return publication


def test_reconcile_leaves_a_publication_a_live_worker_claimed_alone(environment, settings):
    publication = _claimed(environment, timedelta(seconds=settings.BELLWETHER_RENDER_CLAIM_S - 5))

    assert publication_reconcile_task() == 0
    publication.refresh_from_db()
    assert publication.state == "rendering"


def test_reconcile_renders_again_a_publication_whose_worker_died(environment, settings):
    # A claim older than the render's hard limit (plus a margin): its worker is gone.
    publication = _claimed(environment, timedelta(seconds=settings.BELLWETHER_RENDER_CLAIM_S + 1))

    assert publication_reconcile_task() == 1

    publication.refresh_from_db()
    assert publication.state == "ready" and publication.snapshot.number == 1


def test_a_dead_worker_is_noticed_within_a_minute_of_its_claim(settings):
    """The render's hard limit, the claim's lifetime and beat's sweep interval add
    up to less than a minute, so a killed worker's publication renders again in time."""
    sweep = settings.CELERY_BEAT_SCHEDULE["reconcile-publications"]["schedule"]
    assert sweep <= 20
    assert settings.BELLWETHER_RENDER_SOFT_TIME_LIMIT_S < settings.BELLWETHER_RENDER_TIME_LIMIT_S
    assert settings.BELLWETHER_RENDER_TIME_LIMIT_S < settings.BELLWETHER_RENDER_CLAIM_S
    assert settings.BELLWETHER_RENDER_CLAIM_S + sweep < 60
    assert settings.BELLWETHER_RENDER_UNCLAIMED_S + sweep < 60
    from apps.releases.tasks import publication_render_task
    assert publication_render_task.time_limit == settings.BELLWETHER_RENDER_TIME_LIMIT_S
    assert publication_render_task.soft_time_limit == settings.BELLWETHER_RENDER_SOFT_TIME_LIMIT_S


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


@pytest.mark.postgres  # the test's in-memory SQLite shares one cache between threads:
@pytest.mark.django_db(transaction=True)  # a thread's write fails "table is locked"
def test_periodic_loop_thread_renders_stuck_publication(environment):
    publication = _stuck_publication(environment, timedelta(minutes=10))
    loop = start_periodic_loop(
        schedule={"reconcile": {**RECONCILE["reconcile"], "schedule": 0.1}}, tick=0.05
    )
    try:
        # A cold first render (compiling, forking) can take seconds.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            publication.refresh_from_db()
            if publication.state != "rendering":
                break
            time.sleep(0.05)
    finally:
        loop.stop()
    assert publication.state == "ready"
