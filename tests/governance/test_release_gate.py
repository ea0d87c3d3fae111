"""The one release gate (apps.governance.gates.release_gate) on every path that makes
a snapshot desired by agents — hostile findings and their variants:

- a render held by the degenerate-render guard is refused by a push, a pin, a
  rollout, an environment rollback and a scheduled start as by an activation, until
  confirmed (the service's `confirmed`, the API's `confirm`, the dashboard's box);
- an environment rollback is a release of the content it restores: content that
  was never active here needs an approved release (of activating that snapshot),
  content that was active before does not (the record is by checksum)."""

import pytest

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict
from apps.environments.services import environment_file_put
from apps.fleet.models import Agent, Deployment
from apps.governance import rules, services
from apps.governance.models import ReleaseRequest
from apps.releases import services as releases
from apps.rollouts.models import Rollout
from apps.snapshots.guard import content_was_active
from apps.snapshots.models import Publication
from tests import factories
from tests.api_helpers import assert_error
from tests.governance.conftest import approve

pytestmark = pytest.mark.django_db

ENV = "/api/v1/environments/shop/prod"


def _refusal(call) -> Conflict:
    with pytest.raises(Conflict) as raised:
        call()
    return raised.value


def _held(error: Conflict) -> None:
    assert error.code == "confirmation_required", (error.code, error.message)
    assert {"file": "nginx/shop.conf", "change": "emptied"} in error.details


@pytest.fixture
def degenerate(second, environment, superuser):
    """#3 of the staged shop/prod (where #1 is active): its nginx site emptied, so
    the guard stored it and holds it (nobody confirmed it)."""
    environment_file_put(environment=environment, kind="template", path="nginx/shop.conf",
                         text="", actor=superuser)
    held = factories.publication(environment, superuser)
    assert held.snapshot.number == 3 and held.needs_confirmation is not None
    return held.snapshot


@pytest.fixture
def nodes(environment, superuser):
    return factories.enrolled_agents(environment, 2)


# --- the degenerate-render guard on every path ----------------------------------------


def test_a_push_of_a_held_render_is_refused_until_confirmed(degenerate, environment,
                                                            superuser):
    manual = factories.enrolled_agent(environment, "manual-1", mode="manual", actor=superuser)

    _held(_refusal(lambda: releases.snapshot_deploy(snapshot=degenerate, actor=superuser,
                                                    agent_ids=[manual.pk])))
    assert not Deployment.objects.exists()

    pushed = releases.snapshot_deploy(snapshot=degenerate, actor=superuser,
                                      agent_ids=[manual.pk], confirmed=True)
    assert [d.snapshot_id for d in pushed] == [degenerate.pk]


def test_a_pin_to_a_held_render_is_refused_until_confirmed(degenerate, nodes, superuser):
    node = nodes[0].fresh()

    _held(_refusal(lambda: releases.agent_pin(agent=node, snapshot=degenerate, actor=superuser,
                                              expected_generation=node.generation)))
    assert Agent.objects.get(pk=node.pk).pinned_snapshot_id is None

    held = releases.agent_pin(agent=node, snapshot=degenerate, actor=superuser,
                              expected_generation=node.generation, confirmed=True)
    assert held.pinned_snapshot_id == degenerate.pk


def test_a_rollout_of_a_held_render_is_refused_until_confirmed(degenerate, environment,
                                                               nodes):
    before = {a.pk: a.generation for a in Agent.objects.all()}

    _held(_refusal(lambda: factories.start_rollout(environment, degenerate, nodes[:1])))
    assert not Rollout.objects.exists()
    assert {a.pk: a.generation for a in Agent.objects.all()} == before  # nothing pinned

    rollout = factories.start_rollout(environment, degenerate, nodes[:1], confirmed=True)
    assert rollout.is_active


def test_a_render_confirmed_once_is_released_on_every_path(degenerate, environment,
                                                           superuser, nodes):
    from apps.releases.promotion import publication_confirm

    publication_confirm(publication=Publication.objects.get(snapshot=degenerate),
                        actor=superuser)
    assert factories.start_rollout(environment, degenerate, nodes[:1]).is_active


def test_a_rollback_to_content_that_empties_a_file_is_refused_until_confirmed(
        first, environment, superuser):
    """Rolling back past the addition of a file empties it: the guard asks first
    (nothing is queued), and a confirmed rollback is not held when it is stored."""
    environment_file_put(environment=environment, kind="template", path="extra/motd.txt",
                         text="hello\n", actor=superuser)
    factories.publish(environment, superuser)  # #2, active (the direct policy)

    error = _refusal(lambda: releases.snapshot_rollback(snapshot=first, actor=superuser))
    assert error.code == "confirmation_required"
    assert {"file": "extra/motd.txt", "change": "emptied"} in error.details
    assert not Publication.objects.filter(kind="rollback").exists()

    rolled = factories.render(releases.snapshot_rollback(snapshot=first, actor=superuser,
                                                         confirmed=True))
    environment.refresh_from_db()
    assert rolled.needs_confirmation is None and rolled.activated is True
    assert environment.active_snapshot.checksum == first.checksum


def test_a_scheduled_push_of_a_held_render_fails_saying_so(degenerate, environment,
                                                           superuser, deployer, alice, bob,
                                                           two_approvals):
    from datetime import timedelta

    from django.utils import timezone

    from apps.governance import schedules
    from apps.governance.models import ScheduledRelease
    from apps.releases import scheduled

    manual = factories.enrolled_agent(environment, "manual-1", mode="manual", actor=superuser)
    release = services.release_submit(environment=environment, snapshot=degenerate,
                                      plan=rules.push_plan([manual.pk]), actor=deployer)
    approve(release, alice)
    approve(release, bob)
    schedule = schedules.schedule_create(release=release, actor=deployer,
                                         run_at=timezone.now() + timedelta(minutes=5),
                                         expected_version=1)
    ScheduledRelease.objects.filter(pk=schedule.pk).update(run_at=timezone.now())

    assert scheduled.scheduled_releases_start() == {schedule.pk: "failed"}
    schedule.refresh_from_db()
    release.refresh_from_db()
    assert schedule.outcome_code == "confirmation_required"
    assert release.state == ReleaseRequest.State.OPEN  # not used up: nothing started
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("path, field", [("snapshots/3/deploy", "agents"),
                                         ("rollouts", "canary_agents")])
def test_the_api_refuses_a_held_render_and_takes_confirm(path, field, degenerate, nodes,
                                                         client_for, environment, superuser):
    client = client_for("deployer")
    manual = factories.enrolled_agent(environment, "manual-1", mode="manual", actor=superuser)
    body = {field: [manual.pk], **({"snapshot": 3} if path == "rollouts" else {})}

    error = assert_error(client.post(f"{ENV}/{path}", body, format="json"), 409,
                         "confirmation_required")
    assert {"file": "nginx/shop.conf", "change": "emptied"} in error["details"]
    assert not Rollout.objects.exists() and not Deployment.objects.exists()

    response = client.post(f"{ENV}/{path}", {**body, "confirm": True}, format="json")
    assert response.status_code == 201, response.content[:500]


def test_the_api_pin_refuses_a_held_render_and_takes_confirm(degenerate, nodes, client_for):
    client = client_for("deployer")
    node = nodes[0].fresh()
    url = f"/api/v1/agents/{node.pk}/pin"
    body = {"snapshot": 3, "expected_generation": node.generation}

    assert_error(client.post(url, body, format="json"), 409, "confirmation_required")
    response = client.post(url, {**body, "confirm": True}, format="json")
    assert response.status_code == 200, response.content[:500]
    assert Agent.objects.get(pk=node.pk).pinned_snapshot_id == degenerate.pk


@pytest.mark.parametrize("confirm", ["maybe", 2, None, [True]])
def test_a_confirm_that_is_no_boolean_is_400_naming_it(confirm, degenerate, nodes,
                                                       client_for):
    response = client_for("deployer").post(f"{ENV}/rollouts", {
        "snapshot": 3, "canary_agents": [nodes[0].pk], "confirm": confirm}, format="json")
    error = assert_error(response, 400)
    assert error["details"][0]["field"] == "confirm"
    assert not Rollout.objects.exists()


def test_the_dashboard_rollout_form_asks_for_the_checkbox(degenerate, nodes, deployer):
    client = factories.session_client(deployer)
    form = {"snapshot": "3", "canary": [str(nodes[0].pk)], "waves": "100"}

    refused = client.post("/e/shop/prod/rollouts/new/", form)
    assert refused.status_code == 409
    assert "Release it even if a file is emptied" in refused.content.decode()
    assert not Rollout.objects.exists()

    started = client.post("/e/shop/prod/rollouts/new/", {**form, "confirm": "on"})
    assert started.status_code == 302 and Rollout.objects.get().snapshot_id == degenerate.pk


# --- an environment rollback is a release of the content it restores -----------------


def test_a_rollback_to_content_never_active_needs_an_approval(second, environment,
                                                              superuser, two_approvals):
    """The hostile finding: #2 was never approved nor active; rolling back "to" it
    re-rendered and activated it with no approval."""
    error = _refusal(lambda: releases.snapshot_rollback(snapshot=second, actor=superuser))

    assert error.code == "approval_required" and error.details["missing"] == "release"
    assert "never active here" in error.message
    assert error.details["plan"] == rules.activation_plan()
    assert not Publication.objects.filter(kind="rollback").exists()


def test_an_approved_activation_of_that_snapshot_lets_the_rollback_through_once(
        second, environment, superuser, deployer, alice, bob, two_approvals):
    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.activation_plan(), actor=deployer)
    approve(release, alice)
    approve(release, bob)

    rolled = factories.render(releases.snapshot_rollback(snapshot=second, actor=deployer))

    environment.refresh_from_db()
    release.refresh_from_db()
    assert rolled.activated and environment.active_snapshot.checksum == second.checksum
    assert release.state == ReleaseRequest.State.RELEASED
    assert AuditEvent.objects.get(action="release.use").data["what"] == "rollback"


def test_a_rollback_to_content_that_was_active_needs_no_approval(second, first, environment,
                                                                 superuser, deployer, alice,
                                                                 bob, two_approvals):
    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.activation_plan(), actor=deployer)
    approve(release, alice)
    approve(release, bob)
    releases.snapshot_activate(snapshot=second, actor=deployer)

    rolled = factories.render(releases.snapshot_rollback(snapshot=first, actor=deployer))
    environment.refresh_from_db()
    assert rolled.activated and environment.active_snapshot.checksum == first.checksum
    # By content, whatever the number: #2 ran before, so back to it is a rollback too.
    again = factories.render(releases.snapshot_rollback(snapshot=second, actor=deployer))
    assert again.activated


def test_an_approval_of_another_plan_does_not_cover_a_rollback(second, environment,
                                                               superuser, deployer, alice,
                                                               bob, two_approvals):
    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.push_plan(None), actor=deployer)
    approve(release, alice)
    approve(release, bob)

    error = _refusal(lambda: releases.snapshot_rollback(snapshot=second, actor=deployer))
    assert error.code == "approval_required"
    assert error.details["releases_of_other_plans"] == [release.pk]


def test_the_api_and_dashboard_rollback_refuse_never_active_content(second, deployer,
                                                                    two_approvals):
    api = factories.api_client_for(deployer)
    error = assert_error(api.post(f"{ENV}/snapshots/2/rollback", {}, format="json"), 409,
                         "approval_required")
    assert error["details"][0]["missing"] == "release"
    page = factories.session_client(deployer).post("/e/shop/prod/snapshots/2/rollback/")
    assert page.status_code == 409
    assert not Publication.objects.filter(kind="rollback").exists()


def test_the_rollback_page_warns_of_a_degenerate_render_and_takes_the_checkbox(
        first, environment, superuser, deployer):
    environment_file_put(environment=environment, kind="template", path="extra/motd.txt",
                         text="hello\n", actor=superuser)
    factories.publish(environment, superuser)
    client = factories.session_client(deployer)

    page = client.get("/e/shop/prod/snapshots/1/rollback/").content.decode()
    assert "emptied: extra/motd.txt" in page and 'name="confirm"' in page
    assert client.post("/e/shop/prod/snapshots/1/rollback/").status_code == 409
    assert not Publication.objects.filter(kind="rollback").exists()
    confirmed = client.post("/e/shop/prod/snapshots/1/rollback/", {"confirm": "on"})
    assert confirmed.status_code == 302
    assert Publication.objects.get(kind="rollback").confirmed is True


def test_every_activation_path_records_the_content_as_active(second, environment,
                                                             superuser, nodes):
    assert content_was_active(environment.pk, environment.active_snapshot.checksum)
    assert not content_was_active(environment.pk, second.checksum)
    rollout = factories.start_rollout(environment, second, nodes, canary_gate="auto")
    for node in nodes:
        factories.ack(node, second)
    from apps.rollouts import reconcile

    reconcile.rollout_reconcile(rollout_id=rollout.pk)
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.COMPLETED
    assert content_was_active(environment.pk, second.checksum)
