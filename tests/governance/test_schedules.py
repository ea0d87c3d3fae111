"""Scheduled releases: started at their time by the beat task (inline in embedded
mode, through the same schedule), compare-and-set against the active snapshot and
the release, failing with the reason instead of overwriting newer work."""

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.governance import rules, schedules, services
from apps.governance.models import ScheduledRelease
from apps.releases import scheduled
from apps.releases import services as releases
from project.embedded import run_due
from tests import factories
from tests.governance.conftest import approve

pytestmark = pytest.mark.django_db


def _schedule(release, actor, ahead=timedelta(minutes=5)):
    schedule = schedules.schedule_create(release=release, actor=actor,
                                         run_at=timezone.now() + ahead,
                                         expected_version=release.version)
    ScheduledRelease.objects.filter(pk=schedule.pk).update(
        run_at=timezone.now() - timedelta(seconds=1))  # due now
    return schedule


def _approved(activation, alice, bob):
    approve(activation, alice)
    approve(activation, bob)
    return activation


def test_a_due_scheduled_activation_starts(activation, alice, bob, deployer, environment):
    schedule = _schedule(_approved(activation, alice, bob), deployer)
    assert scheduled.scheduled_releases_start() == {schedule.pk: "started"}
    schedule.refresh_from_db()
    environment.refresh_from_db()
    assert schedule.state == "started" and environment.active_snapshot.number == 2
    assert AuditEvent.objects.filter(action="schedule.start").exists()
    assert scheduled.scheduled_releases_start() == {}  # once


def test_a_schedule_not_yet_due_waits(activation, deployer):
    schedules.schedule_create(release=activation, actor=deployer,
                              run_at=timezone.now() + timedelta(hours=1), expected_version=1)
    assert scheduled.scheduled_releases_start() == {}


def test_it_fails_when_the_active_snapshot_changed_since_scheduling(
        activation, alice, bob, deployer, environment, superuser):
    schedule = _schedule(_approved(activation, alice, bob), deployer)
    # Newer work activated: a rollback to content that ran before (no approval needed).
    releases.snapshot_rollback(snapshot=environment.active_snapshot, actor=superuser)
    factories.render(environment.publications.order_by("-created_at").first())
    environment.refresh_from_db()
    active = environment.active_snapshot_id
    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    environment.refresh_from_db()
    assert schedule.outcome_code == "active_changed" and "#1 then" in schedule.outcome
    assert environment.active_snapshot_id == active  # not overwritten


def test_it_fails_when_the_release_changed_since_scheduling(activation, alice, bob, deployer):
    schedule = _schedule(_approved(activation, alice, bob), deployer)
    services.release_update(release=activation, actor=deployer, expected_version=1,
                            plan=rules.push_plan(None))
    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    assert schedule.outcome_code == "release_changed"


def test_it_fails_saying_what_is_missing_when_not_approved_by_then(activation, deployer,
                                                                   alice):
    approve(activation, alice)
    schedule = _schedule(activation, deployer)
    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    assert schedule.outcome_code == "approval_required"
    assert schedule.result["details"]["missing"] == 1
    assert AuditEvent.objects.filter(action="schedule.fail").exists()


def test_a_scheduled_rollout_starts_with_its_plan(second, environment, deployer, superuser):
    node = factories.enrolled_agents(environment, 2)[0]
    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.rollout_plan(canary_agents=[node.pk]),
                                      actor=deployer)
    schedule = _schedule(release, deployer)
    assert scheduled.scheduled_releases_start() == {schedule.pk: "started"}
    schedule.refresh_from_db()
    assert schedule.result["rollout"] and environment.rollouts.get().is_active


def test_embedded_mode_runs_the_sweep_inline_from_beats_schedule(activation, alice, bob,
                                                                 deployer):
    schedule = _schedule(_approved(activation, alice, bob), deployer)
    entry = {name: e for name, e in settings.CELERY_BEAT_SCHEDULE.items()
             if e["task"] == "apps.releases.scheduled.scheduled_releases_start_task"}
    assert list(entry) == ["start-scheduled-releases"]
    assert run_due(entry, {}, 0.0) == ["start-scheduled-releases"]
    schedule.refresh_from_db()
    assert schedule.state == "started"
