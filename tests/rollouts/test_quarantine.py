"""Quarantine by content: the checksum of rolled-back content is quarantined in its
environment, whatever the number or the request of the snapshot holding it.
(Replaces quarantine by snapshot number.)"""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.audit.models import Action, AuditEvent
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.environments.models import Environment as CurrentEnvironment
from apps.releases import rules as release_rules
from apps.releases import selectors as release_reads
from apps.releases import services as releases
from apps.rollouts.models import SnapshotQuarantine
from apps.rollouts.quarantine import quarantine_lift, quarantine_of
from apps.snapshots.models import Snapshot
from apps.snapshots.rules import Outcome
from apps.tenancy.models import Application, Tenant
from tests import factories
from tests.factories import (
    enrolled_agents,
    publish,
    publish_variant,
    render,
    rollback_publication,
    start_rollout,
)
from tests.rollouts.support import rollback

pytestmark = pytest.mark.django_db


def descriptor(release_id: str) -> dict:
    return {"apiVersion": "bellwether/v1", "application": "shop", "environment": "prod",
            "id": release_id, "version": release_id}


@pytest.fixture
def rolled_back(environment, first, second, superuser):
    """#2 rolled out to one canary and rolled back: #3 (#1's content) is active and
    #2's content is quarantined. Returns (rollout, agents)."""
    nodes = enrolled_agents(environment, 2)
    rollout = start_rollout(environment, second, nodes[:1])
    rollback(rollout, reason="canary failed")  # every pin it held is released
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 3
    return rollout, nodes


def test_the_rule_is_pure_a_quarantined_publication_never_activates_by_itself():
    for is_rollback in (False, True):
        assert not release_rules.publication_activates(
            outcome=Outcome.NEW, is_rollback=is_rollback, release_policy="direct",
            rollout_active=False, quarantined=True)
    assert release_rules.publication_activates(
        outcome=Outcome.NEW, is_rollback=False, release_policy="direct", rollout_active=False)


def test_a_rollback_quarantines_the_checksum_with_its_origin(rolled_back, environment, second):
    rollout, _ = rolled_back
    quarantine = quarantine_of(environment.pk, second.checksum)
    assert (quarantine.snapshot_id, quarantine.rollout_id, quarantine.reason) == (
        second.pk, rollout.pk, "canary failed")


def test_same_content_through_a_different_descriptor_is_flagged_and_refused(
        rolled_back, environment, second, superuser):
    rollout, nodes = rolled_back
    publication, _ = releases.descriptor_submit(environment=environment,
                                                descriptor=descriptor("unrelated-1"),
                                                actor=superuser)
    again = render(publication).snapshot
    assert again.number == 4 and again.checksum == second.checksum
    flags = release_reads.snapshot_state(again, release_reads.snapshot_flags(environment))
    assert flags["quarantined"]["snapshot"] == 2 and flags["quarantined"]["rollout"] == rollout.pk

    with pytest.raises(Conflict) as refused:
        start_rollout(environment, again, nodes[:1])
    assert refused.value.code == "quarantined"
    assert "#2" in refused.value.message and f"rollout {rollout.pk}" in refused.value.message
    for attempt in (lambda: releases.snapshot_activate(snapshot=again, actor=superuser),
                    lambda: releases.snapshot_deploy(snapshot=again, agent_ids=None,
                                                     actor=superuser)):
        with pytest.raises(Conflict) as caught:
            attempt()
        assert caught.value.code == "quarantined"
    agent = nodes[0].agent
    agent.refresh_from_db()
    with pytest.raises(Conflict) as pinned:
        releases.agent_pin(agent=agent, snapshot=again, actor=superuser,
                           expected_generation=agent.generation)
    assert pinned.value.code == "quarantined"


def test_snapshots_are_filtered_by_quarantined_content_whatever_their_number(
        rolled_back, environment, second, superuser, application):
    publication, _ = releases.descriptor_submit(environment=environment,
                                                descriptor=descriptor("unrelated-2"),
                                                actor=superuser)
    assert render(publication).snapshot.checksum == second.checksum  # as #4
    other, *_ = factories.staged_environment(application, "staging", superuser)
    snapshots = Snapshot.objects.filter(environment__in=[environment, other])

    assert sorted(snapshots.quarantined().values_list("environment__name", "number")) == [
        ("prod", 2), ("prod", 4)]
    assert sorted(snapshots.unquarantined().values_list("environment__name", "number")) == [
        ("prod", 1), ("prod", 3), ("staging", 1), ("staging", 2)]


def test_a_direct_environment_stores_quarantined_content_without_activating_it(
        rolled_back, environment, superuser):
    releases.environment_update(environment=environment, release_policy="direct",
                                actor=superuser)
    again = publish(environment, superuser)  # the inputs still hold #2's change
    environment.refresh_from_db()
    assert again.number == 4 and environment.active_snapshot.number == 3


def test_an_owner_override_needs_a_reason_and_is_audited(rolled_back, environment, superuser):
    again = publish(environment, superuser)
    with pytest.raises(ValidationFailed):
        releases.snapshot_activate(snapshot=again, actor=superuser, override_reason=" ")
    releases.snapshot_activate(snapshot=again, actor=superuser, override_reason="fixed infra")
    environment.refresh_from_db()
    assert environment.active_snapshot_id == again.pk
    event = AuditEvent.objects.get(action=Action.QUARANTINE_OVERRIDE)
    assert event.data["reason"] == "fixed infra" and event.data["snapshot"] == 2


def test_reaching_the_content_by_rolling_back_to_an_older_snapshot_is_refused(
        environment, first, superuser):
    """Hostile: #1 holds content X; X is published again as #3, rolled out and
    rolled back; an environment rollback to #1 would re-render X as a new number."""
    releases.environment_update(environment=environment, release_policy="staged",
                                actor=superuser)
    workers_8 = publish_variant(environment, superuser, workers=8)
    releases.snapshot_activate(snapshot=workers_8, actor=superuser)
    again = publish_variant(environment, superuser, workers=4)  # #1's content as #3
    assert again.checksum == first.checksum
    nodes = enrolled_agents(environment, 1)
    rollback(start_rollout(environment, again, nodes))
    with pytest.raises(Conflict) as caught:
        rollback_publication(first, superuser)
    assert caught.value.code == "quarantined"


def test_quarantine_is_per_environment(rolled_back, second, application, superuser):
    """The very content rolled back in shop/prod is not refused in shop/staging."""
    staging = factories.environment(application, "staging", templates=factories.SHOP_TEMPLATES,
                                    actor=superuser)
    publish(staging, superuser)
    releases.environment_update(environment=staging, release_policy="staged", actor=superuser)
    other = publish_variant(staging, superuser, workers=8)
    assert other.checksum == second.checksum
    assert quarantine_of(staging.pk, second.checksum) is None
    releases.snapshot_activate(snapshot=other, actor=superuser)  # not refused
    nodes = enrolled_agents(staging, 1, prefix="stg")
    releases.snapshot_deploy(snapshot=other, agent_ids=[nodes[0].pk], actor=superuser)


def test_an_owner_lifts_the_quarantine_audited(rolled_back, environment, second, superuser):
    again = publish(environment, superuser)
    quarantine_lift(environment=environment, number=again.number, actor=superuser,
                    reason="root cause fixed")
    assert not SnapshotQuarantine.objects.exists()
    assert AuditEvent.objects.filter(action=Action.QUARANTINE_LIFT).count() == 1
    releases.snapshot_activate(snapshot=again, actor=superuser)
    with pytest.raises(NotFound):
        quarantine_lift(environment=environment, number=again.number, actor=superuser)


# --- pending changes after a rollback -------------------------------------------------


def test_pending_after_a_rollback_says_so_and_diffs_against_the_active_snapshot(
        rolled_back, environment):
    rollout, _ = rolled_back
    environment.refresh_from_db()
    pending = release_reads.pending_view(environment)
    assert pending["rolled_back"] == {"rollout": rollout.pk, "snapshot": 2}
    assert f"rolled back in rollout {rollout.pk}" in pending["message"]
    assert pending["against"].number == 3
    assert pending["files"] and "workers" in "".join(f["diff"] for f in pending["files"])


def test_reset_inputs_returns_them_to_the_active_source_audited(rolled_back, environment,
                                                                 superuser):
    before = AuditEvent.objects.count()
    releases.environment_inputs_reset(environment=environment, actor=superuser)
    environment.refresh_from_db()
    assert environment.config == environment.active_snapshot.source["config"]
    pending = release_reads.pending_view(environment)
    assert (pending["rolled_back"], pending["files"]) == (None, [])
    actions = list(AuditEvent.objects.filter(pk__gt=0).order_by("-id")
                   .values_list("action", flat=True)[:AuditEvent.objects.count() - before])
    assert Action.ENVIRONMENT_RESET in actions and Action.ENVIRONMENT_UPDATE in actions


def test_reset_inputs_refuses_without_an_active_snapshot(environment, superuser):
    with pytest.raises(Conflict) as caught:
        releases.environment_inputs_reset(environment=environment, actor=superuser)
    assert caught.value.code == "no_active_snapshot"


def test_the_data_migration_turns_a_snapshot_quarantine_into_its_checksum(
        environment, first, second, superuser):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("apps.rollouts.migrations.0003_quarantine_checksums")
    SnapshotQuarantine.objects.create(environment=environment, checksum="", snapshot=second,
                                      reason="old")
    migration.by_checksum(apps, None)
    quarantine = SnapshotQuarantine.objects.get()
    assert (quarantine.environment_id, quarantine.checksum) == (environment.pk, second.checksum)
    assert quarantine_of(environment.pk, second.checksum).reason == "old"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_release_policy_migration_maps_the_activation_flag():

    before = [("environments", "0004_environment_keep_rollout_pins"),
              ("snapshots", "0004_snapshot_provenance")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    tenant = Tenant.objects.create(name="T", slug="t")
    app = Application.objects.create(tenant=tenant, name="a")
    Environment = executor.loader.project_state(before).apps.get_model("environments",
                                                                       "Environment")
    for name, flag in (("gated", True), ("open", False)):
        Environment.objects.create(application_id=app.pk, name=name, require_activation=flag)
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())
    assert dict(CurrentEnvironment.objects.values_list("name", "release_policy")) == {
        "gated": "staged", "open": "direct"}
