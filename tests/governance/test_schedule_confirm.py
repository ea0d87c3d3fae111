"""A scheduled release carries its scheduler's confirmation of a degenerate render
(the immediate action's `confirm`): stored with the schedule, audited, applied at
the start. It covers only the content checked when scheduling: the compare-and-set
fails the start on any change of the active snapshot or of the release."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.environments.services import environment_file_put
from apps.fleet.models import Deployment
from apps.governance import rules, schedules, services
from apps.governance.models import ReleaseRequest, ScheduledRelease
from apps.releases import scheduled
from apps.releases import services as releases
from tests import factories
from tests.api_helpers import assert_error
from tests.governance.conftest import approve

pytestmark = pytest.mark.django_db


@pytest.fixture
def degenerate(second, environment, superuser):
    """#3 of the staged shop/prod (#1 active): its nginx site emptied, nobody confirmed."""
    environment_file_put(environment=environment, kind="template", path="nginx/shop.conf",
                         text="", actor=superuser)
    held = factories.publication(environment, superuser)
    assert held.snapshot.number == 3 and held.needs_confirmation is not None
    return held.snapshot


@pytest.fixture
def push(degenerate, environment, superuser, deployer, alice, bob, two_approvals):
    """An approved release pushing #3 to a manual agent."""
    manual = factories.enrolled_agent(environment, "manual-1", mode="manual", actor=superuser)
    release = services.release_submit(environment=environment, snapshot=degenerate,
                                      plan=rules.push_plan([manual.pk]), actor=deployer)
    approve(release, alice)
    approve(release, bob)
    release.refresh_from_db()
    return release


def _schedule(release, actor, **options):
    schedule = schedules.schedule_create(release=release, actor=actor,
                                         run_at=timezone.now() + timedelta(minutes=5),
                                         expected_version=release.version, **options)
    ScheduledRelease.objects.filter(pk=schedule.pk).update(run_at=timezone.now())
    return schedule


def test_a_schedule_confirmed_when_scheduled_starts_a_degenerate_render(push, deployer,
                                                                        degenerate):
    schedule = _schedule(push, deployer, confirmed=True)

    assert scheduled.scheduled_releases_start() == {schedule.pk: "started"}
    assert [d.snapshot_id for d in Deployment.objects.all()] == [degenerate.pk]
    created = AuditEvent.objects.get(action="schedule.create")
    assert created.data["confirmed"] is True
    assert created.data["degenerate"]["emptied"] == ["nginx/shop.conf"]
    assert "confirmed" in created.summary


def test_a_schedule_not_confirmed_fails_saying_why(push, deployer):
    schedule = _schedule(push, deployer)

    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    assert schedule.outcome_code == "confirmation_required"
    assert {"file": "nginx/shop.conf", "change": "emptied"} in schedule.result["details"]
    assert AuditEvent.objects.get(action="schedule.create").data["confirmed"] is False


def test_the_confirmation_does_not_outlive_a_change_of_the_release(push, deployer, alice,
                                                                   second):
    """The content confirmed is the content checked when scheduling: the release moved
    to another snapshot fails the start (release_changed) before any gate."""
    schedule = _schedule(push, deployer, confirmed=True)
    services.release_update(release=push, actor=alice, expected_version=push.version,
                            snapshot=second)

    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    assert schedule.outcome_code == "release_changed"
    assert not Deployment.objects.exists()


def test_the_confirmation_does_not_outlive_a_change_of_the_active_snapshot(
        push, deployer, second, environment, superuser, alice, bob):
    schedule = _schedule(push, deployer, confirmed=True)
    activation = services.release_submit(environment=environment, snapshot=second,
                                         plan=rules.activation_plan(), actor=deployer)
    approve(activation, alice)
    approve(activation, bob)
    releases.snapshot_activate(snapshot=second, actor=deployer)

    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    assert schedule.outcome_code == "active_changed"
    assert ReleaseRequest.objects.get(pk=push.pk).state == ReleaseRequest.State.OPEN


def test_the_api_takes_confirm_and_answers_it(push, deployer):
    api = factories.api_client_for(deployer)
    run_at = (timezone.now() + timedelta(minutes=5)).isoformat()

    response = api.post(f"/api/v1/releases/{push.pk}/schedule",
                        {"run_at": run_at, "expected_version": push.version, "confirm": True},
                        format="json")

    assert response.status_code == 201, response.content
    assert response.json()["confirmed"] is True
    assert ScheduledRelease.objects.get().confirmed is True


def test_the_api_without_confirm_schedules_unconfirmed_and_refuses_a_bad_flag(push,
                                                                              deployer):
    api = factories.api_client_for(deployer)
    run_at = (timezone.now() + timedelta(minutes=5)).isoformat()
    url = f"/api/v1/releases/{push.pk}/schedule"

    assert_error(api.post(url, {"run_at": run_at, "expected_version": push.version,
                                "confirm": "maybe"}, format="json"), 400)
    assert not ScheduledRelease.objects.exists()
    plain = api.post(url, {"run_at": run_at, "expected_version": push.version},
                     format="json")
    assert plain.status_code == 201 and plain.json()["confirmed"] is False


def test_the_dashboard_lists_a_confirmed_schedule(push, deployer):
    _schedule(push, deployer, confirmed=True)
    page = factories.session_client(deployer).get("/e/shop/prod/governance/")
    assert "a degenerate render confirmed when scheduled" in page.content.decode()
