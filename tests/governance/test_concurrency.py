"""Two people acting at once on governance, on PostgreSQL with real row locks:
threads released together by a barrier, each on its own connection."""

import threading
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from functools import partial

import pytest
from django.db import connection
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict
from apps.governance import rules, schedules, services
from apps.governance.models import Approval, ReleaseRequest, ScheduledRelease
from apps.governance.selectors import approval_missing
from apps.releases import scheduled
from tests.governance.conftest import approve

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 60


def _outcome(call):
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
        return exc
    finally:
        connection.close()


def _race(calls) -> list:
    barrier = threading.Barrier(len(calls))

    def run(call):
        barrier.wait(timeout=TIMEOUT_S)
        return _outcome(call)

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls, timeout=TIMEOUT_S))


def test_two_approvers_racing_both_count(activation, alice, bob):
    outcomes = _race([lambda: approve(activation, alice), lambda: approve(activation, bob)])
    assert all(isinstance(o, ReleaseRequest) for o in outcomes), outcomes
    assert Approval.objects.filter(release=activation, cancelled_at__isnull=True).count() == 2
    assert approval_missing(ReleaseRequest.objects.get(pk=activation.pk)) is None


def test_one_approver_racing_themselves_counts_once(activation, alice):
    outcomes = _race([lambda: approve(activation, alice), lambda: approve(activation, alice)])
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == 1 and refused[0].code == "already_decided", outcomes
    assert Approval.objects.filter(release=activation).count() == 1


def test_an_approval_racing_a_plan_change_never_stands_for_old_content(activation, alice,
                                                                       deployer):
    for _round in range(3):
        activation.refresh_from_db()
        version, checksum, digest = (activation.version, activation.checksum,
                                     activation.plan_digest)
        plan = (rules.push_plan(None) if activation.plan["kind"] == "activate"
                else rules.activation_plan())
        Approval.objects.filter(release=activation).delete()
        outcomes = _race([
            partial(services.release_decide, release=activation, actor=alice,
                    decision="approve", checksum=checksum, plan_digest=digest),
            partial(services.release_update, release=activation, actor=deployer,
                    expected_version=version, plan=plan)])
        assert isinstance(outcomes[1], ReleaseRequest), outcomes
        assert isinstance(outcomes[0], ReleaseRequest | Conflict), outcomes
        current = ReleaseRequest.objects.get(pk=activation.pk)
        standing = Approval.objects.filter(release=current, cancelled_at__isnull=True)
        assert not standing.exclude(plan_digest=current.plan_digest).exists()


def test_two_submits_of_one_content_make_one_release(second, environment, deployer, alice):
    def submit(actor):
        return lambda: services.release_submit(environment=environment, snapshot=second,
                                               plan=rules.activation_plan(), actor=actor)

    outcomes = _race([submit(deployer), submit(alice)])
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert len(refused) == 1 and refused[0].code == "release_exists", outcomes
    assert ReleaseRequest.objects.filter(environment=environment).count() == 1


def test_two_runs_of_one_schedule_start_it_once(activation, alice, bob, deployer, environment):
    approve(activation, alice)
    approve(activation, bob)
    schedule = schedules.schedule_create(release=activation, actor=deployer,
                                         run_at=timezone.now() + timedelta(minutes=1),
                                         expected_version=1)
    ScheduledRelease.objects.filter(pk=schedule.pk).update(run_at=timezone.now())
    outcomes = _race([lambda: scheduled.scheduled_release_start(schedule_id=schedule.pk),
                      lambda: scheduled.scheduled_release_start(schedule_id=schedule.pk)])
    # The second finds it started already (and says so): one activation only.
    assert outcomes == ["started", "started"], outcomes
    assert AuditEvent.objects.filter(action="schedule.start").count() == 1
    assert AuditEvent.objects.filter(action="snapshot.activate").count() == 1
    assert ScheduledRelease.objects.get(pk=schedule.pk).state == "started"


def test_two_rollbacks_racing_for_one_approval_release_once(second, environment, deployer,
                                                             alice, bob, superuser,
                                                             two_approvals):
    """Content never active here: one approved activation of it covers a rollback. A
    rollback's request checks the release and its re-render uses it, with the
    activation: both requests are queued (each renders as it commits); the first
    stored uses the release, the other restores content now active (or is
    superseded by it). The release is used once."""
    from apps.releases import services as releases
    from apps.snapshots.models import Publication

    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.activation_plan(), actor=deployer)
    approve(release, alice)
    approve(release, bob)
    outcomes = _race([lambda: releases.snapshot_rollback(snapshot=second, actor=deployer),
                      lambda: releases.snapshot_rollback(snapshot=second, actor=superuser)])
    assert all(isinstance(o, Publication) for o in outcomes), outcomes
    environment.refresh_from_db()
    assert environment.active_snapshot.checksum == second.checksum
    assert AuditEvent.objects.filter(action="release.use").count() == 1
    assert ReleaseRequest.objects.get(pk=release.pk).state == "released"
    assert (set(Publication.objects.filter(kind="rollback").values_list("state", flat=True))
            <= {"ready", "superseded"})


def test_a_rollback_racing_an_activation_for_one_approval_uses_it_once(
        second, environment, deployer, alice, bob, superuser, two_approvals):
    """Whichever is stored first uses the approved release with its activation; the
    other restores content now active, or is refused (older than the active, or the
    release used) — never a second use, never unapproved content."""
    from apps.releases import services as releases

    release = services.release_submit(environment=environment, snapshot=second,
                                      plan=rules.activation_plan(), actor=deployer)
    approve(release, alice)
    approve(release, bob)
    outcomes = _race([lambda: releases.snapshot_rollback(snapshot=second, actor=deployer),
                      lambda: releases.snapshot_activate(snapshot=second, actor=superuser)])
    refused = [o for o in outcomes if isinstance(o, Exception)]
    assert all(isinstance(o, Conflict) and o.code in ("rollback_required", "approval_required")
               for o in refused), outcomes
    environment.refresh_from_db()
    assert environment.active_snapshot.checksum == second.checksum
    assert AuditEvent.objects.filter(action="release.use").count() == 1


def test_an_owner_editing_and_approving_at_once_never_approves_their_edit(activation, alice):
    """Whichever comes first, no standing approval is by an editor of the content the
    release holds now."""
    for version in (1, 2, 3):
        activation.refresh_from_db()
        plan = (rules.push_plan(None) if activation.plan["kind"] == "activate"
                else rules.activation_plan())
        checksum, digest = activation.checksum, activation.plan_digest
        outcomes = _race([
            partial(services.release_decide, release=activation, actor=alice,
                    decision="approve", checksum=checksum, plan_digest=digest),
            partial(services.release_update, release=activation, actor=alice,
                    expected_version=version, plan=plan)])
        assert isinstance(outcomes[1], ReleaseRequest), outcomes
        assert not Approval.objects.filter(release=activation, approver=alice,
                                           cancelled_at__isnull=True).exists(), outcomes


def test_the_last_approval_racing_an_activation_never_activates_unapproved_content(
        activation, alice, bob, deployer, environment, first, second, member):
    """Both lock the environment: the approval lands first (the activation goes
    through and uses the release) or the activation is refused (409
    approval_required, 1 of 2) and a retry after the approval goes through. An
    approval after the release was used is refused (release_closed)."""
    from apps.releases import services as releases

    approve(activation, alice)
    outcomes = _race([lambda: approve(activation, bob),
                      lambda: releases.snapshot_activate(snapshot=second, actor=deployer)])
    assert isinstance(outcomes[0], ReleaseRequest), outcomes  # open until it is used
    environment.refresh_from_db()
    if isinstance(outcomes[1], Exception):
        assert outcomes[1].code == "approval_required", outcomes
        assert (outcomes[1].details["given"], outcomes[1].details["required"]) == (1, 2)
        assert environment.active_snapshot_id == first.pk
        assert ReleaseRequest.objects.get(pk=activation.pk).state == "open"
        releases.snapshot_activate(snapshot=second, actor=deployer)
        environment.refresh_from_db()
    assert environment.active_snapshot_id == second.pk
    assert ReleaseRequest.objects.get(pk=activation.pk).state == "released"
    assert AuditEvent.objects.filter(action="release.use").count() == 1
    late = _outcome(lambda: approve(activation, member("owner", username="carol")))
    assert isinstance(late, Conflict) and late.code == "release_closed", late


def test_two_people_confirming_a_held_render_at_once_activate_it_once(first, environment,
                                                                       superuser, alice, bob):
    """A degenerate render stored and held (the direct policy would have activated
    it): both confirmations answer, one is recorded, the snapshot is activated once."""
    from apps.environments.services import environment_file_put
    from apps.releases.promotion import publication_confirm
    from apps.snapshots.models import Publication
    from tests import factories

    environment_file_put(environment=environment, kind="template", path="nginx/shop.conf",
                         text="", actor=superuser)
    held = factories.publication(environment, superuser)
    assert held.needs_confirmation is not None and held.activated is False
    activations = AuditEvent.objects.filter(action="snapshot.activate").count()

    outcomes = _race([lambda: publication_confirm(publication=held, actor=alice),
                      lambda: publication_confirm(publication=held, actor=bob)])
    assert all(isinstance(o, Publication) and o.confirmed for o in outcomes), outcomes
    environment.refresh_from_db()
    assert environment.active_snapshot_id == held.snapshot_id
    assert Publication.objects.get(pk=held.pk).activated is True
    assert AuditEvent.objects.filter(action="publication.confirm").count() == 1
    assert AuditEvent.objects.filter(action="snapshot.activate").count() == activations + 1
