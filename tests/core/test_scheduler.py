"""The scheduler's absence (apps.core.scheduler): recorded runs, when it counts as
late, and what a running rollout, the dashboard and /metrics say then. The real
`celery beat` recording its runs: tests/e2e/test_scheduler_absent.py."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils import timezone

from apps.core import scheduler
from apps.core.models import SchedulerBeat
from apps.rollouts.rules import shown_reason
from tests import factories
from tests.core.test_metrics import scrape

SINCE = timezone.now().replace(microsecond=0) - timedelta(minutes=5)


@pytest.mark.parametrize(("state", "stored", "late", "shown"), [
    ("running", "", None, ""),
    ("running", "waiting: freeze", None, "waiting: freeze"),
    ("running", "", SINCE, f"waiting for the scheduler since {SINCE:%Y-%m-%d %H:%M:%S} UTC"),
    ("running", "waiting: freeze", SINCE,
     f"waiting for the scheduler since {SINCE:%Y-%m-%d %H:%M:%S} UTC; waiting: freeze"),
    ("paused", "wave 1 not acknowledged", SINCE, "wave 1 not acknowledged"),
    ("completed", "", SINCE, ""),
])
def test_a_running_rollout_says_first_that_it_waits_for_a_late_scheduler(state, stored, late,
                                                                         shown):
    assert shown_reason(SimpleNamespace(state=state, reason=stored), late) == shown


def seen(ago: timedelta) -> None:
    SchedulerBeat.objects.update_or_create(pk=1, defaults={"seen_at": timezone.now() - ago})


@pytest.mark.django_db
def test_late_only_past_two_reconcile_intervals_and_never_before_a_first_run():
    assert scheduler.late_after() == timedelta(seconds=30)
    assert scheduler.scheduler_late_since() is None  # a new installation
    seen(timedelta(seconds=29))
    assert scheduler.scheduler_late_since() is None
    seen(timedelta(seconds=31))
    assert scheduler.scheduler_late_since() == SchedulerBeat.objects.get().seen_at


@pytest.mark.django_db
def test_runs_are_recorded_at_most_every_few_seconds(monkeypatch, django_assert_num_queries):
    clock = SimpleNamespace(now=1000.0)
    monkeypatch.setattr(scheduler.time, "monotonic", lambda: clock.now)
    monkeypatch.setattr(scheduler, "_recorded_at", 0.0)
    scheduler.scheduler_seen()
    first = SchedulerBeat.objects.get().seen_at
    clock.now += scheduler.RECORDED_EVERY_S - 1
    with django_assert_num_queries(0):
        scheduler.scheduler_seen()
    clock.now += 1
    scheduler.scheduler_seen()
    assert SchedulerBeat.objects.get().seen_at > first


def test_the_api_the_dashboard_and_metrics_name_a_late_scheduler(running_rollout, superuser):
    rollout = running_rollout
    api = factories.api_client_for(superuser)
    page = factories.session_client(superuser)
    environment_page = reverse("dashboard:environment", args=[
        rollout.environment.application.name, rollout.environment.name])
    seen(timedelta(seconds=1))
    assert api.get(f"/api/v1/rollouts/{rollout.pk}").json()["reason"] == ""
    assert b"Waiting for the scheduler" not in page.get("/").content
    assert scrape()[("bellwether_scheduler_late", ())] == 0

    seen(timedelta(minutes=5))

    listed = api.get(f"/api/v1/environments/{rollout.environment.full_name}/rollouts").json()
    detail = api.get(f"/api/v1/rollouts/{rollout.pk}").json()
    assert detail["reason"].startswith("waiting for the scheduler since ")
    assert listed["results"][0]["reason"] == detail["reason"]
    assert b"Waiting for the scheduler since" in page.get("/").content
    assert b"(waiting for the scheduler since" in page.get(environment_page).content
    assert scrape()[("bellwether_scheduler_late", ())] == 1
    assert scrape()[("bellwether_scheduler_last_seen_timestamp_seconds", ())] == pytest.approx(
        SchedulerBeat.objects.get().seen_at.timestamp())
