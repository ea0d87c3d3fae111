"""Retention (apps.releases.retention): the bounds beat applies, the one rule of what
is never removed, and an owner's removal with a reason."""

import pytest
from django.db import transaction

from apps.audit.models import Action, AuditEvent
from apps.core.errors import Conflict, ValidationFailed
from apps.fleet.models import Deployment
from apps.releases import retention
from apps.releases import services as releases
from apps.rollouts.models import Rollout
from apps.snapshots.models import Publication, Snapshot
from tests import factories
from tests.rollouts.support import rollback

pytestmark = pytest.mark.django_db


def numbers(environment) -> list[int]:
    return list(Snapshot.objects.filter(environment=environment).order_by("number")
                .values_list("number", flat=True))


def published(environment, actor, count: int) -> list[Snapshot]:
    """`count` snapshots of distinct content; the last one active (direct policy)."""
    return [factories.publish_variant(environment, actor, workers=10 + i) for i in range(count)]


def bound(environment, actor, **bounds):
    return releases.environment_update(environment=environment, actor=actor, **bounds)


def test_beat_removes_the_oldest_beyond_the_count_keeping_active_and_rollback_target(
        environment, superuser):
    published(environment, superuser, 6)
    bound(environment, superuser, retention_snapshots=3)

    went = retention.retention_sweep()

    assert went == {"snapshots": 3, "rollouts": 0}
    assert numbers(environment) == [4, 5, 6]
    removed = AuditEvent.objects.filter(action=Action.SNAPSHOT_REMOVE).order_by("id")
    assert [e.data["number"] for e in removed] == [1, 2, 3]
    assert all(e.data["reason"].startswith("retention:") and e.data["bytes"] > 0
               for e in removed)
    assert Snapshot.objects.get(environment=environment, number=4).parent is None
    assert not Publication.objects.filter(environment=environment, snapshot__isnull=True).exists()


def test_the_byte_bound_removes_the_oldest_until_the_rest_fits(application, superuser):
    # 600 kB of text per file: each snapshot stores it in its source, files and bundle.
    big = factories.environment(application, "big", actor=superuser,
                                templates={"big.txt": "{{ workers }}" + "x" * 600_000})
    s = published(big, superuser, 4)
    sizes = dict(Snapshot.objects.with_stored_bytes().filter(environment=big)
                 .values_list("number", "stored_bytes"))
    assert all(size > 1 << 20 for size in sizes.values())
    bound(big, superuser, retention_bytes=1 << 20)

    went = retention.environment_retention_apply(environment_id=big.pk)

    # Over the bound still, but #4 is active and #3 the rollback target.
    assert went["snapshots"] == 2 and numbers(big) == [s[2].number, s[3].number]


def test_every_hold_keeps_its_snapshot(environment, superuser):
    s = published(environment, superuser, 8)  # #8 active, #7 the rollback target
    pinned, manual, applied = factories.enrolled_agents(environment, 3)
    releases.agent_pin(agent=pinned.agent, snapshot=s[5], actor=superuser,
                       expected_generation=pinned.fresh().generation)
    factories.ack(applied, s[7])
    agent = releases.fleet.agent_update(agent=manual.agent, actor=superuser, mode="manual")
    releases.snapshot_deploy(snapshot=s[1], agent_ids=[agent.pk], actor=superuser)
    bound(environment, superuser, retention_snapshots=2)

    retention.environment_retention_apply(environment_id=environment.pk)

    assert numbers(environment) == [2, 6, 7, 8]
    environment.refresh_from_db()
    with transaction.atomic():
        kept = retention.snapshot_holds(environment, [x.pk for x in (s[1], *s[5:])])
    assert set(kept[s[1].pk]) == {"desired", "pushed"}
    assert kept[s[5].pk] == ["pinned"]
    assert set(kept[s[6].pk]) == {"rollback_target"}
    assert set(kept[s[7].pk]) == {"active", "applied"}


def test_an_unfinished_rollout_and_kept_rollout_history_hold_their_snapshots(
        environment, superuser):
    first = factories.publish(environment, superuser)
    releases.environment_update(environment=environment, release_policy="staged",
                                actor=superuser)
    second = factories.publish_variant(environment, superuser, workers=8)
    nodes = factories.enrolled_agents(environment, 2)
    rollout = factories.start_rollout(environment, second, nodes[:1])
    published(environment, superuser, 3)
    bound(environment, superuser, retention_snapshots=2, retention_rollouts=1)

    retention.environment_retention_apply(environment_id=environment.pk)
    assert {first.number, second.number} <= set(numbers(environment))

    rollback(rollout, reason="canary failed")  # finished; #2 quarantined, #6 active
    retention.environment_retention_apply(environment_id=environment.pk)
    assert second.number in numbers(environment)  # quarantined: the record of a rollback
    environment.refresh_from_db()
    with transaction.atomic():
        holds = retention.snapshot_holds(environment, [second.pk])[second.pk]
    assert "quarantined" in holds and "rollout_history" in holds


def test_rollout_history_beyond_its_bound_is_trimmed_and_frees_its_snapshots(
        environment, superuser):
    factories.publish(environment, superuser)
    releases.environment_update(environment=environment, release_policy="staged",
                                actor=superuser)
    nodes = factories.enrolled_agents(environment, 1)
    for workers in (8, 9):
        snapshot = factories.publish_variant(environment, superuser, workers=workers)
        rollout = factories.start_rollout(environment, snapshot, nodes)
        Rollout.objects.filter(pk=rollout.pk).update(state="completed")
        releases.fleet.Agent.objects.filter(pk=nodes[0].pk).update(pin_rollout=None,
                                                                   pinned_snapshot=None)
    bound(environment, superuser, retention_rollouts=1)

    went = retention.environment_retention_apply(environment_id=environment.pk)

    assert went["rollouts"] == 1
    assert Rollout.objects.filter(environment=environment).count() == 1
    assert AuditEvent.objects.filter(action=Action.ROLLOUT_DELETE).count() == 1


def test_an_owner_removes_an_unheld_snapshot_with_its_finished_deployments(
        environment, superuser):
    s = published(environment, superuser, 4)
    node = factories.enrolled_agents(environment, 1)[0]
    factories.ack(node, s[0])
    factories.ack(node, s[3])  # applied moves on; the report of #1 is history

    retention.snapshot_remove(snapshot=s[0], actor=superuser, reason="leaked a hostname")

    assert numbers(environment) == [2, 3, 4]
    assert not Deployment.objects.filter(snapshot_id=s[0].pk).exists()
    event = AuditEvent.objects.get(action=Action.SNAPSHOT_REMOVE)
    assert event.actor == superuser and event.data["reason"] == "leaked a hostname"


def test_removing_the_active_snapshot_is_refused_naming_why(environment, superuser):
    s = published(environment, superuser, 2)
    with pytest.raises(Conflict) as refused:
        retention.snapshot_remove(snapshot=s[1], actor=superuser, reason="mistake")
    assert refused.value.code == "snapshot_kept"
    assert [d["reason"] for d in refused.value.details] == ["active"]
    with pytest.raises(Conflict):
        retention.snapshot_remove(snapshot=s[0], actor=superuser, reason="rollback target")
    assert numbers(environment) == [1, 2]
    assert not AuditEvent.objects.filter(action=Action.SNAPSHOT_REMOVE).exists()


def test_removing_needs_a_reason(environment, superuser):
    s = published(environment, superuser, 3)
    with pytest.raises(ValidationFailed) as refused:
        retention.snapshot_remove(snapshot=s[0], actor=superuser, reason="   ")
    assert refused.value.code == "reason_required"
    assert numbers(environment) == [1, 2, 3]


def test_a_rendering_rollback_keeps_what_it_rolls_back_to(environment, superuser):
    s = published(environment, superuser, 4)
    releases.snapshot_rollback(snapshot=s[0], actor=superuser)  # queued, not rendered
    with pytest.raises(Conflict) as refused:
        retention.snapshot_remove(snapshot=s[0], actor=superuser, reason="old")
    assert [d["reason"] for d in refused.value.details] == ["rendering"]


def test_usage_reports_counts_and_bytes_against_the_bounds(environment, superuser):
    published(environment, superuser, 2)
    usage = retention.retention_usage(environment)
    assert usage["snapshots"] == {"count": 2, "bound": 100}
    assert 0 < usage["bytes"]["stored"] < usage["bytes"]["bound"] == 1 << 30
    assert usage["rollouts"] == {"count": 0, "bound": 100}


def test_after_a_removal_the_next_snapshot_of_the_day_gets_a_new_label(environment, superuser):
    """A removed snapshot leaves a gap in the day's labels, never a repeat (hostile
    finding: the next publish hit the label's unique constraint)."""
    first = factories.publish(environment, superuser)
    factories.publish_variant(environment, superuser, workers=7)
    factories.publish_variant(environment, superuser, workers=8)
    retention.snapshot_remove(snapshot=first, actor=superuser, reason="test")

    fourth = factories.publish_variant(environment, superuser, workers=9)

    prefix = first.label.rsplit("-", 1)[0]
    assert fourth.label == f"{prefix}-004" and fourth.state == "ready"


def test_a_snapshot_a_governance_release_names_is_kept(environment, superuser):
    from apps.governance import rules as governance_rules
    from apps.governance import services as governance

    factories.publish(environment, superuser)
    second = factories.publish_variant(environment, superuser, workers=7)
    factories.publish_variant(environment, superuser, workers=8)
    governance.release_submit(environment=environment, snapshot=second,
                              plan=governance_rules.activation_plan(), actor=superuser)

    with pytest.raises(Conflict) as refused:
        retention.snapshot_remove(snapshot=second, actor=superuser, reason="test")
    assert "release" in {d["reason"] for d in refused.value.details}
