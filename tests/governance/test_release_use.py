"""An approved release is used only with the outcome it authorises, in one
transaction: an environment rollback's release is used when its re-render is
stored and activated, so a render that fails (invalid, stopped by its time limit),
or a finish the gate or the release rules refuse, leaves the release open and
approved; every immediate path (activation, push, pin, rollout, scheduled start,
a held render's confirmation) that fails after the gate passed rolls its use back."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict
from apps.fleet import services as fleet
from apps.governance import rules, schedules, services
from apps.governance.models import ReleaseRequest, ScheduledRelease
from apps.releases import publishing, scheduled
from apps.releases import services as releases
from apps.releases.promotion import publication_confirm
from apps.rollouts import services as rollouts
from apps.snapshots.models import Publication
from configlang.problems import Problem
from configlang.rendering import Rendered
from tests import factories
from tests.api_helpers import assert_error
from tests.governance.conftest import approve

pytestmark = pytest.mark.django_db

ENV = "/api/v1/environments/shop/prod"


def _approved(environment, snapshot, plan, deployer, alice, bob) -> ReleaseRequest:
    release = services.release_submit(environment=environment, snapshot=snapshot, plan=plan,
                                      actor=deployer)
    approve(release, alice)
    approve(release, bob)
    return release


@pytest.fixture
def approved(second, environment, deployer, alice, bob, two_approvals):
    """An approved release of activating #2, whose content was never active here."""
    return _approved(environment, second, rules.activation_plan(), deployer, alice, bob)


def _unused(release: ReleaseRequest) -> None:
    release.refresh_from_db()
    assert release.state == ReleaseRequest.State.OPEN and release.released_at is None
    assert services.selectors.approval_missing(release) is None  # still approved
    assert not AuditEvent.objects.filter(action="release.use").exists()


def _invalid(publication) -> Rendered:
    return Rendered(effective_config={}, problems=[Problem("schema", "workers: not a number")])


# --- an environment rollback -----------------------------------------------------------


@pytest.mark.parametrize("fails", ["invalid", "stopped"])
def test_a_rollback_whose_render_fails_leaves_its_release_approved(
        fails, approved, second, first, environment, deployer, monkeypatch):
    queued = releases.snapshot_rollback(snapshot=second, actor=deployer)
    _unused(approved)  # asked for, not used: nothing was activated yet
    if fails == "invalid":
        monkeypatch.setattr(publishing, "publication_rendered", _invalid)
        finished = factories.render(queued)
    else:  # the render's time limit stopped it (the task's SoftTimeLimitExceeded)
        finished = publishing.publication_abandon(publication_id=str(queued.pk),
                                                  reason="rendering took too long")

    assert (finished.state, finished.activated) == ("invalid", False)
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk
    _unused(approved)
    monkeypatch.undo()
    again = factories.render(releases.snapshot_rollback(snapshot=second, actor=deployer))
    approved.refresh_from_db()
    assert again.activated and approved.state == ReleaseRequest.State.RELEASED
    assert AuditEvent.objects.get(action="release.use").data["what"] == "rollback"


def test_a_rollback_rendered_into_other_content_needs_its_own_approval(
        approved, second, first, environment, deployer, monkeypatch):
    """The approval was given for the content the rollback restores; when the
    re-render makes other bytes (the engine changed since), that content is new: the
    finish's gate refuses it, the snapshot is held, and the release is not used."""
    original = publishing.publication_rendered

    def changed(publication):
        rendered = original(publication)
        rendered.files = [{**rendered.files[0],
                           "content": rendered.files[0]["content"] + "# rendered anew\n"},
                          *rendered.files[1:]]
        return rendered
    queued = releases.snapshot_rollback(snapshot=second, actor=deployer)
    monkeypatch.setattr(publishing, "publication_rendered", changed)

    finished = factories.render(queued)

    assert finished.state == "ready" and finished.activated is False
    assert finished.snapshot.checksum != second.checksum
    assert finished.held["code"] == "approval_required"
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk
    _unused(approved)


def test_a_rollback_superseded_while_it_rendered_leaves_its_release_approved(
        approved, second, first, environment, deployer, superuser):
    """A publish asked for after the rollback finished first: the rollback's older
    inputs are not stored, nothing is activated, and its release is not used."""
    queued = releases.snapshot_rollback(snapshot=second, actor=deployer)
    factories.publish_variant(environment, superuser, workers=11)  # staged: stored only

    finished = factories.render(queued)

    assert (finished.state, finished.activated) == ("superseded", False)
    _unused(approved)


def test_a_rollback_refused_at_its_finish_is_held_saying_why(approved, second, environment,
                                                            deployer, alice):
    """The release changed while the rollback rendered: its approvals were cancelled,
    so the finish's gate refuses, the snapshot is stored and held, and nothing used."""
    queued = releases.snapshot_rollback(snapshot=second, actor=deployer)
    services.release_update(release=approved, actor=alice, expected_version=1,
                            plan=rules.push_plan(None))

    finished = factories.render(queued)

    assert finished.activated is False and finished.held["code"] == "approval_required"
    approved.refresh_from_db()
    assert approved.state == ReleaseRequest.State.OPEN
    assert not AuditEvent.objects.filter(action="release.use").exists()


def test_a_rollback_held_at_its_finish_is_confirmed_into_activation_with_its_release(
        approved, second, first, environment, deployer, superuser, monkeypatch):
    """The re-render of #2's content is stored as #4 (a later #3 exists) and held at
    its finish for a degenerate render (the active snapshot changed while it
    rendered); confirming it activates #4 with the release approving #2's content,
    used once — the approval names the number it restores, not the new one."""
    factories.publish_variant(environment, superuser, workers=11)  # #3, staged
    queued = releases.snapshot_rollback(snapshot=second, actor=deployer)
    monkeypatch.setattr(publishing, "degenerate_findings",
                        lambda env, files: {"files": [{"file": "app.yaml", "change": "emptied"}]})
    held = factories.render(queued)
    monkeypatch.undo()
    assert (held.snapshot.number, held.activated) == (4, False)
    assert held.snapshot.checksum == second.checksum and held.needs_confirmation
    _unused(approved)

    confirmed = publication_confirm(publication=held, actor=deployer)

    environment.refresh_from_db()
    assert confirmed.activated and environment.active_snapshot_id == held.snapshot_id
    approved.refresh_from_db()
    assert approved.state == ReleaseRequest.State.RELEASED
    assert AuditEvent.objects.filter(action="release.use").count() == 1


def test_a_confirmed_rollback_into_other_bytes_still_needs_its_own_approval(
        approved, second, first, environment, deployer, superuser, monkeypatch):
    """Held at its finish and rendered into other bytes than #2's: confirming it
    records the confirmation and holds it for an approval of its own content."""
    original = publishing.publication_rendered

    def changed(publication):
        rendered = original(publication)
        rendered.files = [{**rendered.files[0],
                           "content": rendered.files[0]["content"] + "# rendered anew\n"},
                          *rendered.files[1:]]
        return rendered
    queued = releases.snapshot_rollback(snapshot=second, actor=deployer)
    monkeypatch.setattr(publishing, "publication_rendered", changed)
    monkeypatch.setattr(publishing, "degenerate_findings",
                        lambda env, files: {"files": [{"file": "app.yaml", "change": "emptied"}]})
    held = factories.render(queued)
    monkeypatch.undo()

    confirmed = publication_confirm(publication=held, actor=deployer)

    assert confirmed.confirmed and not confirmed.activated
    assert confirmed.held["code"] == "approval_required"
    _unused(approved)


def test_the_api_rollback_answers_and_a_failed_render_uses_nothing(approved, deployer,
                                                                   monkeypatch):
    monkeypatch.setattr(publishing, "publication_rendered", _invalid)
    api = factories.api_client_for(deployer)

    queued = api.post(f"{ENV}/snapshots/2/rollback", {}, format="json")
    assert queued.status_code == 202, queued.content
    factories.render(Publication.objects.get(pk=queued.json()["id"]))

    assert api.get(queued.json()["url"]).json()["state"] == "invalid"
    _unused(approved)


def test_the_dashboard_rollback_with_a_failed_render_uses_nothing(approved, deployer,
                                                                  monkeypatch):
    monkeypatch.setattr(publishing, "publication_rendered", _invalid)
    page = factories.session_client(deployer).post("/e/shop/prod/snapshots/2/rollback/")
    assert page.status_code == 302
    factories.render(Publication.objects.get(kind="rollback"))
    _unused(approved)


# --- every immediate path: the use and the outcome in one transaction -------------------


def _boom(*args, **kwargs):
    raise Conflict("The step after the gate failed.", code="boom")


def _activation(env, snapshot, nodes, deployer, monkeypatch):
    return (lambda: monkeypatch.setattr(fleet, "environment_activate", _boom),
            lambda: releases.snapshot_activate(snapshot=snapshot, actor=deployer))


def _push(env, snapshot, nodes, deployer, monkeypatch):
    manual = factories.enrolled_agent(env, "manual-1", mode="manual", actor=deployer)
    return (lambda: monkeypatch.setattr(fleet, "pushes_create", _boom),
            lambda: releases.snapshot_deploy(snapshot=snapshot, agent_ids=[manual.pk],
                                             actor=deployer))


def _pin(env, snapshot, nodes, deployer, monkeypatch):
    return (lambda: monkeypatch.setattr(fleet, "agent_pin_hold", _boom),
            lambda: releases.agent_pin(agent=nodes[0].agent, snapshot=snapshot,
                                       expected_generation=nodes[0].agent.generation,
                                       actor=deployer))


def _rollout(env, snapshot, nodes, deployer, monkeypatch):
    return (lambda: monkeypatch.setattr(rollouts.bounds, "history_prune", _boom),
            lambda: factories.start_rollout(env, snapshot, nodes[:1], actor=deployer))


def _scheduled(env, snapshot, nodes, deployer, monkeypatch):
    def start():
        release = ReleaseRequest.objects.filter(state="open").first()
        if release is None:  # what the gate asks for: a release of activating it
            releases.snapshot_activate(snapshot=snapshot, actor=deployer)
        schedule = schedules.schedule_create(release=release, actor=deployer,
                                             run_at=timezone.now() + timedelta(minutes=5),
                                             expected_version=release.version)
        ScheduledRelease.objects.filter(pk=schedule.pk).update(run_at=timezone.now())
        assert scheduled.scheduled_release_start(schedule_id=schedule.pk) == "failed"
        schedule.refresh_from_db()
        raise Conflict(schedule.outcome, code=schedule.outcome_code)
    return lambda: monkeypatch.setattr(schedules, "schedule_started", _boom), start


@pytest.mark.parametrize("path", [_activation, _push, _pin, _rollout, _scheduled],
                         ids=["activation", "push", "pin", "rollout", "scheduled"])
def test_a_path_that_fails_after_the_gate_leaves_its_release_approved(
        path, second, first, environment, deployer, alice, bob, two_approvals, monkeypatch):
    nodes = factories.enrolled_agents(environment, 2)
    breaks, act = path(environment, second, nodes, deployer, monkeypatch)
    with pytest.raises(Conflict) as asked:  # the gate names the plan to approve
        act()
    assert asked.value.code == "approval_required", asked.value.message
    plan = asked.value.details["plan"]
    release = _approved(environment, second, plan, deployer, alice, bob)
    breaks()

    with pytest.raises(Conflict) as refused:
        act()

    assert refused.value.code == "boom", refused.value.message
    _unused(release)
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk
    assert services.selectors.release_for(environment.pk, second, plan) == release


def test_an_activation_through_the_api_that_fails_after_the_gate_uses_nothing(
        approved, deployer, monkeypatch):
    monkeypatch.setattr(fleet, "environment_activate", _boom)
    api = factories.api_client_for(deployer)
    assert_error(api.post(f"{ENV}/snapshots/2/activate", {}, format="json"), 409, "boom")
    _unused(approved)
