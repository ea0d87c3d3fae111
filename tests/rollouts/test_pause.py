"""Pausing and resuming a rollout: the services (CAS, allowed states, audit, what
reconcile does with a paused rollout) and their API routes, with roles."""

from datetime import timedelta

import pytest

from apps.audit.models import AuditEvent
from apps.rollouts import pausing
from apps.rollouts.models import Rollout
from apps.rollouts.reconcile import rollout_reconcile
from tests.api_helpers import assert_error
from tests.factories import ack, start_rollout
from tests.rollouts.support import fresh, rollback

pytestmark = pytest.mark.django_db

AUTO_WAVES = [{"percent": 100, "gate": "auto"}]


def rollout_url(rollout_id: int, suffix: str) -> str:
    return f"/api/v1/rollouts/{rollout_id}{suffix}"


@pytest.fixture
def nodes(fleet, second):
    return fleet(3)


@pytest.fixture
def running(environment, second, nodes):
    """web-1 canary behind an automatic gate, then the rest behind another."""
    return start_rollout(environment, second, nodes[:1], waves=AUTO_WAVES, canary_gate="auto")


def pause(rollout, actor=None, **options):
    return pausing.rollout_pause(rollout=rollout, actor=actor,
                                 expected_version=fresh(rollout).version, **options)


def resume(rollout, actor=None):
    return pausing.rollout_resume(rollout=rollout, actor=actor,
                                  expected_version=fresh(rollout).version)


def test_a_paused_rollout_is_not_advanced_and_resuming_lets_it_go_on(running, nodes, second,
                                                                      superuser):
    pause(running, superuser)
    ack(nodes[0], second)  # would advance an automatic gate at once

    assert rollout_reconcile(rollout_id=running.pk) == "idle"
    paused = fresh(running)
    assert (paused.state, paused.current_wave, paused.version) == ("paused", 0, 2)
    assert paused.reason == f"paused by {superuser.username}"

    resume(running, superuser)
    assert fresh(running).state == "running"
    assert rollout_reconcile(rollout_id=running.pk) == "advanced"
    actions = list(AuditEvent.objects.filter(object_type="rollouts.rollout",
                                             object_id=str(running.pk))
                   .order_by("id").values_list("action", flat=True))
    assert actions == ["rollout.create", "rollout.pause", "rollout.resume", "rollout.advance"]


def test_resuming_restarts_the_waves_clock_so_a_timed_out_wave_does_not_pause_again(
        running):
    Rollout.objects.filter(pk=running.pk).update(
        wave_started_at=fresh(running).wave_started_at - timedelta(hours=2))
    assert rollout_reconcile(rollout_id=running.pk) == "paused"
    assert "not acknowledged within 3600s" in fresh(running).reason

    resume(running)

    assert rollout_reconcile(rollout_id=running.pk) == "waiting"
    assert (fresh(running).state, fresh(running).reason) == ("running", "")


def test_a_paused_rollout_still_rolls_back_on_failures(running, nodes, second):
    pause(running, reason="looking at the canary")
    ack(nodes[0], second, status="failed")

    assert rollout_reconcile(rollout_id=running.pk) == "rolled_back"
    assert fresh(running).state == "rolled_back"


@pytest.mark.parametrize(("action", "code"), [
    ("pause_paused", "rollout_paused"), ("resume_running", "rollout_running"),
    ("pause_finished", "rollout_finished"), ("resume_finished", "rollout_finished")])
def test_a_transition_from_the_wrong_state_is_409_and_changes_nothing(running, action, code):
    if action == "pause_paused":
        pause(running)
    if action.endswith("finished"):
        rollback(running)
    before = fresh(running)
    service = pause if action.startswith("pause") else resume

    with pytest.raises(Exception) as raised:
        service(running)

    assert (raised.value.status, raised.value.code) == (409, code)
    after = fresh(running)
    assert (after.state, after.version) == (before.state, before.version)


def test_pausing_at_a_stale_version_is_409(running):
    with pytest.raises(Exception) as raised:
        pausing.rollout_pause(rollout=running, actor=None, expected_version=7)
    assert raised.value.code == "stale"
    assert fresh(running).state == "running"


# --- the API ------------------------------------------------------------------------------


def test_a_deployer_pauses_and_resumes_through_the_api(client_for, running):
    deployer = client_for("deployer")

    paused = deployer.post(rollout_url(running.pk, "/pause"), {"expected_version": 1},
                           format="json")
    assert paused.status_code == 200, paused.content
    assert (paused.json()["state"], paused.json()["version"]) == ("paused", 2)

    resumed = deployer.post(rollout_url(running.pk, "/resume"), {"expected_version": 2},
                            format="json")
    assert resumed.status_code == 200, resumed.content
    assert (resumed.json()["state"], resumed.json()["version"]) == ("running", 3)


@pytest.mark.parametrize("suffix", ["/pause", "/resume"])
def test_the_api_refuses_a_viewer_a_stale_version_bad_input_and_outsiders(
        client_for, outsider, api_client, running, suffix):
    if suffix == "/resume":
        pause(running)
    version = fresh(running).version
    url = rollout_url(running.pk, suffix)
    deployer = client_for("deployer")
    assert_error(client_for("viewer").post(url, {"expected_version": version}, format="json"),
                 403, "permission_denied")
    assert_error(deployer.post(url, {"expected_version": version + 5}, format="json"),
                 409, "stale")
    assert_error(deployer.post(url, {"expected_version": "x"}, format="json"), 400)
    assert_error(api_client(outsider).post(url, {"expected_version": version}, format="json"),
                 404)
    assert fresh(running).version == version
