"""Migration snapshots.0009_activecontent: the record of the content an environment
has run (what lets an environment rollback restore content without a new approval)
is filled from what was known before it existed — the active snapshot,
publications that activated theirs, and explicit activations, which only their
audit events (`snapshot.activate`, data `number`) remember."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.audit.models import Action, AuditEvent
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.snapshots.models import ActiveContent
from tests import factories

BEFORE = [("snapshots", "0008_snapshot_retention")]
MIGRATION = [("snapshots", "0009_activecontent")]


def _migrate(targets) -> MigrationExecutor:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_migration_records_content_explicit_activations_made_active(
        environment, first, superuser, application):
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    second = factories.publish_variant(environment, superuser, workers=8)
    third = factories.publish_variant(environment, superuser, workers=9)
    never = factories.publish_variant(environment, superuser, workers=10)
    releases.snapshot_activate(snapshot=second, actor=superuser)  # explicit, then left
    releases.snapshot_activate(snapshot=third, actor=superuser)
    staging = factories.environment(application, "staging", actor=superuser)
    for env, data in ((staging, {"number": never.number}),  # another environment's #4
                      (environment, {"number": str(never.number)}), (environment, {})):
        AuditEvent.objects.create(action=Action.SNAPSHOT_ACTIVATE, environment=env,
                                  actor_name="old", object_type="snapshots.snapshot",
                                  data=data)

    executor = _migrate(BEFORE)  # ActiveContent does not exist yet
    assert "snapshots_activecontent" not in connection.introspection.table_names()
    old = executor.loader.project_state(BEFORE).apps
    # Before the record, an explicit activation left no trace but its audit event.
    assert not old.get_model("snapshots", "Publication").objects.filter(
        snapshot_id=second.pk, activated=True).exists()
    _migrate(MIGRATION)

    recorded = set(ActiveContent.objects.values_list("environment_id", "checksum",
                                                     "first_number"))
    assert recorded == {(environment.pk, first.checksum, 1),  # its publication activated it
                        (environment.pk, second.checksum, 2),  # the audit event only
                        (environment.pk, third.checksum, 3)}  # the active snapshot
    assert never.checksum not in {checksum for _, checksum, _ in recorded}
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())  # as every other test expects
