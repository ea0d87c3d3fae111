"""The gates at the service layer: activation, push and rollouts refuse until
approved (409 approval_required, naming what is missing); approvals are bound to
the content; freezes hold activation, pushes and wave advances, and reconcile waits
saying why; an owner's override lets them through, audited."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict, PermissionDenied, ValidationFailed
from apps.environments.services import environment_file_put
from apps.governance import rules, services, windows
from apps.governance.models import ReleaseRequest
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.rollouts import reconcile
from apps.rollouts import services as rollouts
from tests import factories
from tests.governance.conftest import approve

pytestmark = pytest.mark.django_db


def _refusal(call) -> Conflict:
    with pytest.raises(Conflict) as raised:
        call()
    return raised.value


def test_activation_refuses_without_a_release_and_names_it(second, two_approvals, deployer):
    error = _refusal(lambda: releases.snapshot_activate(snapshot=second, actor=deployer))
    assert error.code == "approval_required"
    assert error.details["missing"] == "release" and error.details["snapshot"] == 2


def test_activation_refuses_until_two_owners_approve(activation, second, alice, bob,
                                                     deployer, environment):
    approve(activation, alice)
    error = _refusal(lambda: releases.snapshot_activate(snapshot=second, actor=deployer))
    assert (error.code, error.details["given"], error.details["missing"]) == (
        "approval_required", 1, 1)
    assert error.details["approved_by"] == ["alice"]
    approve(activation, bob)
    releases.snapshot_activate(snapshot=second, actor=deployer)
    environment.refresh_from_db()
    activation.refresh_from_db()
    assert environment.active_snapshot_id == second.pk
    assert activation.state == ReleaseRequest.State.RELEASED
    assert AuditEvent.objects.filter(action="release.use", object_id=str(activation.pk)).exists()


def test_the_author_cannot_approve_their_own_change(activation, deployer, superuser):
    for author in (deployer, superuser):  # who asked, and who published the snapshot
        with pytest.raises(PermissionDenied) as raised:
            approve(activation, author)
        assert raised.value.code == "not_an_approver"


def test_a_viewer_who_is_not_an_owner_may_not_approve(activation, member):
    with pytest.raises(PermissionDenied):
        approve(activation, member("viewer", username="vic"))


def test_an_approval_naming_a_stale_checksum_or_plan_is_refused(activation, alice, first):
    error = _refusal(lambda: services.release_decide(
        release=activation, actor=alice, decision="approve", checksum=first.checksum,
        plan_digest=activation.plan_digest))
    assert error.code == "stale" and error.details["checksum"] == activation.checksum
    error = _refusal(lambda: services.release_decide(
        release=activation, actor=alice, decision="approve", checksum=activation.checksum,
        plan_digest=rules.plan_digest(rules.push_plan(None))))
    assert error.code == "stale"
    assert not activation.approvals.exists()


def test_changing_the_plan_cancels_every_approval_given(activation, alice, bob, deployer,
                                                        second, environment, superuser):
    factories.enrolled_agent(environment, "manual-1", mode="manual", actor=superuser)
    approve(activation, alice)
    approve(activation, bob)
    services.release_update(release=activation, actor=deployer, expected_version=1,
                            plan=rules.push_plan(None))
    activation.refresh_from_db()
    assert activation.version == 2
    assert activation.approvals.filter(cancelled_at__isnull=True).count() == 0
    error = _refusal(lambda: releases.snapshot_deploy(snapshot=second, agent_ids=None,
                                                      actor=deployer))
    assert error.details["given"] == 0  # the push plan is the release's now, unapproved
    # The old plan (activation) has no release at all any more.
    error = _refusal(lambda: releases.snapshot_activate(snapshot=second, actor=deployer))
    assert error.details["missing"] == "release"


def test_a_stricter_rule_later_does_not_invalidate_an_approval_unless_strict(
        activation, alice, bob, superuser, environment, second, deployer, member):
    approve(activation, alice)
    approve(activation, bob)
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=3)
    assert releases.snapshot_activate(snapshot=second, actor=deployer)  # held to 2


def test_a_strict_environment_holds_releases_to_the_rule_in_force(activation, alice, bob,
                                                                  superuser, environment,
                                                                  second, deployer):
    approve(activation, alice)
    approve(activation, bob)
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=3,
                               strict=True)
    error = _refusal(lambda: releases.snapshot_activate(snapshot=second, actor=deployer))
    assert (error.details["required"], error.details["given"]) == (3, 2)


def test_a_rejection_holds_the_release_and_needs_a_comment(activation, alice, bob, second,
                                                           deployer):
    with pytest.raises(ValidationFailed):
        services.release_decide(release=activation, actor=alice, decision="reject",
                                checksum=activation.checksum,
                                plan_digest=activation.plan_digest)
    services.release_decide(release=activation, actor=alice, decision="reject",
                            checksum=activation.checksum, plan_digest=activation.plan_digest,
                            comment="not during the sale")
    error = _refusal(lambda: approve(activation, bob))
    assert error.code == "release_closed"
    error = _refusal(lambda: releases.snapshot_activate(snapshot=second, actor=deployer))
    assert error.code == "approval_required"


def test_a_platform_admin_skips_only_where_the_rule_allows(activation, superuser, environment,
                                                           second, deployer):
    with pytest.raises(PermissionDenied):
        services.release_skip(release=activation, actor=superuser, reason="hotfix")
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=2,
                               admins_may_skip=True, strict=True)
    services.release_skip(release=activation, actor=superuser, reason="hotfix")
    releases.snapshot_activate(snapshot=second, actor=deployer)
    assert AuditEvent.objects.filter(action="release.skip").exists()


def test_a_rollout_refuses_until_its_exact_plan_is_approved(second, environment, deployer,
                                                            two_approvals, alice, bob):
    nodes = factories.enrolled_agents(environment, 2)
    plan = rules.rollout_plan(canary_agents=[nodes[0].pk])
    error = _refusal(lambda: factories.start_rollout(environment, second, nodes[:1]))
    assert error.code == "approval_required"
    release = services.release_submit(environment=environment, snapshot=second, plan=plan,
                                      actor=deployer)
    approve(release, alice)
    approve(release, bob)
    error = _refusal(lambda: factories.start_rollout(environment, second, nodes[:1],
                                                     failure_threshold=1))
    assert error.details["missing"] == "release"  # another plan than the one approved
    rollout = factories.start_rollout(environment, second, nodes[:1])
    assert rollout.is_active


def test_publishing_in_a_governed_direct_environment_stores_without_activating(
        environment, first, superuser, two_approvals):
    snapshot = factories.publish_variant(environment, superuser, workers=9)
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk and snapshot.number == 2


def _freeze(environment, actor, minutes_from=-1, minutes=60, name="sale"):
    now = timezone.now()
    return windows.window_create(environment=environment, actor=actor, kind="freeze",
                                 name=name, starts_at=now + timedelta(minutes=minutes_from),
                                 ends_at=now + timedelta(minutes=minutes))


def test_a_freeze_refuses_activation_push_and_rollouts(second, environment, superuser):
    _freeze(environment, superuser)
    nodes = factories.enrolled_agents(environment, 2)
    manual = factories.enrolled_agent(environment, "manual-1", mode="manual", actor=superuser)
    for call in (lambda: releases.snapshot_activate(snapshot=second, actor=superuser),
                 lambda: releases.snapshot_deploy(snapshot=second, agent_ids=[manual.pk],
                                                  actor=superuser),
                 lambda: factories.start_rollout(environment, second, nodes[:1])):
        error = _refusal(call)
        assert error.code == "frozen" and error.details["window"] == "sale"


def test_an_owners_override_lets_releases_through_and_is_audited(second, environment,
                                                                 superuser, alice):
    _freeze(environment, superuser)
    windows.freeze_override(environment=environment, actor=alice, reason="outage fix",
                            minutes=15)
    releases.snapshot_activate(snapshot=second, actor=superuser)
    event = AuditEvent.objects.get(action="freeze.override")
    assert event.data["reason"] == "outage fix" and event.data["held_by"]["window"] == "sale"


def test_a_freeze_makes_reconcile_wait_and_say_why(second, environment, superuser):
    nodes = factories.enrolled_agents(environment, 2)
    rollout = factories.start_rollout(environment, second, nodes[:1], canary_gate="auto")
    factories.ack(nodes[0], second)
    _freeze(environment, superuser)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "frozen"
    rollout.refresh_from_db()
    assert rollout.current_wave == 0 and rollout.reason.startswith("waiting: the freeze 'sale'")
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "frozen"
    assert AuditEvent.objects.filter(action="rollout.held").count() == 1  # once, not per run
    error = _refusal(lambda: rollouts.rollout_confirm(rollout=rollout, actor=superuser,
                                                      expected_version=rollout.version))
    assert error.code == "frozen"
    windows.window_delete(window=environment.release_windows.get(), actor=superuser)
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"


def test_a_pin_to_newer_content_passes_the_gates_holding_back_does_not(second, environment,
                                                                       superuser, first,
                                                                       two_approvals):
    node = factories.enrolled_agents(environment, 1)[0].fresh()
    error = _refusal(lambda: releases.agent_pin(agent=node, snapshot=second, actor=superuser,
                                                expected_generation=node.generation))
    assert error.code == "approval_required"
    _freeze(environment, superuser)
    held = releases.agent_pin(agent=node, snapshot=first, actor=superuser,
                              expected_generation=node.generation)
    assert held.pinned_snapshot_id == first.pk  # holding an agent still is no release


def test_asking_for_and_giving_an_approval_are_announced_for_webhooks(
        activation, alice, second, environment, monkeypatch):
    from apps.core import events
    from tests.governance.conftest import approve

    heard = []
    monkeypatch.setattr(events, "_subscribers", [
        lambda name, *, environment_id, data: heard.append((name, environment_id, data))])
    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.push_plan([]), actor=alice)
    approve(activation, alice)

    assert heard == [
        ("approval.requested", environment.pk,
         {"approval": release.pk, "snapshot": second.number, "requested_by": "alice"}),
        ("approval.given", environment.pk,
         {"approval": activation.pk, "snapshot": second.number, "given_by": "alice"})]


def test_a_pin_to_older_content_never_active_is_a_release_too(environment, superuser):
    """An older snapshot may hold content never released (hostile finding): a pin
    to it needs an approval; content once active here is a rollback's, and the
    active content is ungated."""
    first = factories.publish(environment, superuser)
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    never = factories.publish_variant(environment, superuser, workers=7)
    third = factories.publish_variant(environment, superuser, workers=9)
    releases.snapshot_activate(snapshot=third, actor=superuser)
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=2)
    node = factories.enrolled_agents(environment, 1)[0].fresh()

    error = _refusal(lambda: releases.agent_pin(agent=node, snapshot=never, actor=superuser,
                                                expected_generation=node.generation))
    assert error.code == "approval_required"
    back = releases.agent_pin(agent=node, snapshot=first, actor=superuser,
                              expected_generation=node.generation)
    assert back.pinned_snapshot_id == first.pk
    held = releases.agent_pin(agent=back, snapshot=third, actor=superuser,
                              expected_generation=back.generation)
    assert held.pinned_snapshot_id == third.pk


def test_an_environment_rollback_waits_for_the_freeze_or_an_override(environment, superuser):
    first = factories.publish(environment, superuser)
    factories.publish_variant(environment, superuser, workers=9)
    _freeze(environment, superuser)

    error = _refusal(lambda: releases.snapshot_rollback(snapshot=first, actor=superuser))
    assert error.code == "frozen"
    windows.freeze_override(environment=environment, actor=superuser, reason="outage",
                            minutes=30)
    assert releases.snapshot_rollback(snapshot=first, actor=superuser).kind == "rollback"


def test_a_release_plans_wave_limits_are_part_of_what_is_approved():
    plain = rules.rollout_plan(waves=[{"percent": 100}])
    limited = rules.rollout_plan(waves=[{"percent": 100, "max_in_flight": 1,
                                         "max_failures": 1}])
    assert limited["waves"][0]["max_in_flight"] == 1
    assert rules.plan_digest(plain) != rules.plan_digest(limited)


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+14:00", "9999-12-31T20:00:00"])
def test_a_window_beyond_the_supported_years_is_400_not_500(moment, environment, superuser):
    from datetime import datetime

    from apps.core.errors import ValidationFailed as Invalid

    start = datetime.fromisoformat(moment)
    with pytest.raises(Invalid) as raised:
        windows.window_create(environment=environment, actor=superuser, kind="freeze",
                              name="far", starts_at=start, ends_at=start + timedelta(hours=1)
                              if start.year < 9999 else start)
    assert raised.value.details == {"field": "starts_at"}


def test_who_changed_an_input_the_release_holds_is_an_author(first, environment, superuser,
                                                             alice, bob, deployer,
                                                             two_approvals):
    """alice's template edit is part of #2's change against what runs (#1): she is
    one of its authors, though someone else published it and another asked."""
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    environment_file_put(environment=environment, kind="template", path="extra.conf",
                         text="from alice\n", actor=alice)
    second = factories.publish(environment, superuser)
    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.activation_plan(), actor=deployer)

    with pytest.raises(PermissionDenied) as raised:
        approve(release, alice)
    assert raised.value.code == "not_an_approver"
    approve(release, bob)  # bob changed nothing


def test_a_change_the_running_snapshot_holds_makes_no_author_of_the_next(
        first, environment, superuser, alice, bob, deployer):
    environment_file_put(environment=environment, kind="template", path="extra.conf",
                         text="from alice\n", actor=alice)
    factories.publish(environment, superuser)  # #2, active: not yet governed
    services.approval_rule_set(environment=environment, actor=superuser, required_approvals=2)
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    environment_file_put(environment=environment, kind="template", path="extra.conf",
                         text="from bob\n", actor=bob)
    third = factories.publish(environment, superuser)
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 2 and third.number == 3
    release = services.release_submit(environment=environment, snapshot=third,
                                      plan=rules.activation_plan(), actor=deployer)

    with pytest.raises(PermissionDenied):
        approve(release, bob)
    approve(release, alice)  # her change runs already: #3's change is bob's
