"""Publishing, deduplicating, numbering, rolling back and pending changes (real DB).

`snapshot_publish` queues the render on commit, which never comes inside a test's
transaction; each test renders itself, as the Celery task does (with
`publication_complete`, or through tests/factories.py).
"""

import gzip

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict
from apps.environments.models import Environment
from apps.environments.services import environment_file_put
from apps.releases.publishing import publication_complete
from apps.releases.services import environment_update, snapshot_publish, snapshot_rollback
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.selectors import pending_changes
from configlang.rendering import content_checksum
from tests import factories

BROKEN_APP_TEMPLATE = '{"log_level": {{ log_level | tojson }}, "workers": {{ threads }}}\n'


def fresh(environment) -> Environment:
    return Environment.objects.get(pk=environment.pk)


def counter(environment) -> int:
    return fresh(environment).snapshot_counter


def make_invalid(environment, actor):
    """Two problems: a template using an undefined name, and a schema the config breaks."""
    environment_file_put(environment=environment, kind="template", path="shop/app.json",
                         text=BROKEN_APP_TEMPLATE, actor=actor)
    environment_update(environment=environment, actor=actor,
                       config_schema={"properties": {"workers": {"type": "string"}}})


def make_valid_again(environment, actor):
    environment_update(environment=environment, actor=actor, config_schema=None)
    environment_file_put(environment=environment, kind="template", path="shop/app.json",
                         text='{"workers": {{ workers }}}\n', actor=actor)


def actions(environment, prefix="snapshot.") -> list[str]:
    return list(
        AuditEvent.objects.filter(environment=environment, action__startswith=prefix)
        .order_by("id")
        .values_list("action", flat=True)
    )


# --- publish, numbers and labels ---------------------------------------------------


def test_first_publish_gets_number_one_and_todays_label(environment, superuser):
    publication = factories.publication(environment, superuser)
    snapshot = publication.snapshot
    assert publication.state == Publication.State.READY
    assert publication.deduplicated is False
    assert snapshot.state == Snapshot.State.READY, snapshot.report
    assert snapshot.number == 1
    assert snapshot.label == f"{timezone.now():%Y%m%d}-001"
    assert snapshot.author == superuser
    assert snapshot.parent is None
    assert snapshot.checksum == content_checksum(snapshot.files)
    assert snapshot.report["valid"] is True
    assert counter(environment) == 1


def test_snapshot_stores_its_source_and_effective_config(environment, superuser):
    snapshot = factories.publish(environment, superuser)
    assert snapshot.source["config"] == environment.config
    assert [t["path"] for t in snapshot.source["templates"]] == ["nginx/shop.conf",
                                                                 "shop/app.json"]
    assert snapshot.source["limits"]["max_files"] >= 1
    assert snapshot.effective_config["server_name"] == "shop.example.com"
    app_json = next(f for f in snapshot.files if f["path"] == "shop/app.json")
    assert app_json["content"] == '{"log_level": "info", "workers": 4}\n'


def test_publish_captures_the_config_at_publish_time(environment, superuser):
    queued = snapshot_publish(environment=environment, actor=superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 9"))
    snapshot = publication_complete(publication_id=str(queued.pk)).snapshot
    assert snapshot.effective_config["workers"] == 4


def test_duplicate_publish_returns_the_same_snapshot(environment, superuser):
    first = factories.publication(environment, superuser)
    again = factories.publication(environment, superuser)
    assert again.pk != first.pk
    assert again.state == Publication.State.READY
    assert again.deduplicated is True
    assert again.snapshot == first.snapshot


def test_duplicate_publish_allocates_no_number(environment, superuser):
    factories.publication(environment, superuser)
    factories.publication(environment, superuser)
    assert counter(environment) == 1
    assert Snapshot.objects.filter(environment=environment).count() == 1
    assert actions(environment) == ["snapshot.create"]


def test_changed_content_gets_the_next_number_and_label(environment, superuser):
    first = factories.publish(environment, superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 8"))
    second = factories.publish(environment, superuser)
    assert second.number == 2
    assert second.label == f"{timezone.now():%Y%m%d}-002"
    assert second.parent == first
    assert second.checksum != first.checksum


def test_a_changed_fallback_file_is_not_deduplicated(environment, superuser):
    first = factories.publish(environment, superuser)
    environment_file_put(environment=environment, kind="fallback", path="nginx/shop.conf",
                         text="# safe\n", actor=superuser)
    second = factories.publication(environment, superuser)
    assert second.deduplicated is False
    assert second.snapshot.number == 2
    assert second.snapshot.checksum == first.checksum  # the rendered files are the same
    assert second.snapshot.fallback_files == [{"path": "nginx/shop.conf", "content": "# safe\n"}]


# --- invalid snapshots -------------------------------------------------------------


def test_invalid_publish_stores_every_problem_in_the_report(environment, superuser):
    make_invalid(environment, superuser)
    publication = factories.publication(environment, superuser)
    snapshot = publication.snapshot
    assert publication.state == Publication.State.INVALID
    assert snapshot.state == Snapshot.State.INVALID
    assert snapshot.report["valid"] is False
    assert {(e["code"], e.get("file"), e.get("key")) for e in snapshot.report["errors"]} == {
        ("config_schema", "config", "workers"),
        ("template_undefined", "shop/app.json", None),
    }
    undefined = next(e for e in snapshot.report["errors"] if e["code"] == "template_undefined")
    assert undefined["line"] == 1


def test_invalid_snapshot_has_no_files(environment, superuser):
    make_invalid(environment, superuser)
    snapshot = factories.publish(environment, superuser)
    assert snapshot.files == []
    assert snapshot.fallback_files == []
    assert snapshot.checksum == ""
    assert snapshot.source["config"] == environment.config  # kept, to show what failed


def test_invalid_publish_consumes_its_number_and_the_next_is_not_reused(environment, superuser):
    first = factories.publish(environment, superuser)
    make_invalid(environment, superuser)
    invalid = factories.publish(environment, superuser)
    make_valid_again(environment, superuser)
    third = factories.publish(environment, superuser)
    assert [first.number, invalid.number, third.number] == [1, 2, 3]
    assert invalid.label.endswith("-002")
    assert third.label.endswith("-003")
    assert counter(environment) == 3


def test_invalid_publish_of_the_first_snapshot_still_takes_number_one(environment, superuser):
    make_invalid(environment, superuser)
    assert factories.publish(environment, superuser).number == 1
    make_valid_again(environment, superuser)
    assert factories.publish(environment, superuser).number == 2


def test_parent_is_the_previous_ready_snapshot(environment, superuser):
    first = factories.publish(environment, superuser)
    make_invalid(environment, superuser)
    invalid = factories.publish(environment, superuser)
    make_valid_again(environment, superuser)
    third = factories.publish(environment, superuser)
    assert invalid.parent == first
    assert third.parent == first


def test_identical_content_after_an_invalid_snapshot_is_deduplicated(environment, superuser):
    first = factories.publish(environment, superuser)
    make_invalid(environment, superuser)
    factories.publication(environment, superuser)
    environment_update(environment=environment, actor=superuser, config_schema=None)
    environment_file_put(environment=environment, kind="template", path="shop/app.json",
                         text=factories.APP_TEMPLATE, actor=superuser)
    again = factories.publication(environment, superuser)
    assert again.deduplicated is True
    assert again.snapshot == first
    assert counter(environment) == 2


# --- immutability ------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        {"files": [{"path": "evil.conf", "content": "evil\n"}]},
        {"checksum": "sha256:" + "0" * 64},
        {"state": "invalid"},
        {"label": "19700101-001"},
        {"number": 99},
        {"report": {}},
        {"source": {}},
        {"effective_config": {"tampered": True}},
        {"bundle": b"{}"},
        {"bundle_gzip": b"tampered"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_stored_snapshot_cannot_be_updated(environment, superuser, change):
    snapshot = factories.publish(environment, superuser)
    with pytest.raises(IntegrityError), transaction.atomic():
        Snapshot.objects.filter(pk=snapshot.pk).update(**change)
    stored = Snapshot.objects.get(pk=snapshot.pk)
    assert (stored.files, stored.checksum, stored.state) == (
        snapshot.files, snapshot.checksum, snapshot.state
    )


def test_an_invalid_snapshot_cannot_be_updated_either(environment, superuser):
    make_invalid(environment, superuser)
    snapshot = factories.publish(environment, superuser)
    with pytest.raises(IntegrityError), transaction.atomic():
        Snapshot.objects.filter(pk=snapshot.pk).update(state="ready")
    assert Snapshot.objects.get(pk=snapshot.pk).state == Snapshot.State.INVALID


def test_deleting_the_author_keeps_the_snapshot(environment, member):
    deployer = member("deployer")
    snapshot = factories.publish(environment, deployer)
    deployer.delete()
    stored = Snapshot.objects.get(pk=snapshot.pk)
    assert stored.author is None
    assert (stored.files, stored.checksum) == (snapshot.files, snapshot.checksum)


def test_the_author_can_be_cleared_but_not_reassigned(environment, member, make_user):
    deployer = member("deployer")
    snapshot = factories.publish(environment, deployer)
    with pytest.raises(IntegrityError), transaction.atomic():
        Snapshot.objects.filter(pk=snapshot.pk).update(author=make_user("impostor"))
    assert Snapshot.objects.get(pk=snapshot.pk).author == deployer


# --- rollback ----------------------------------------------------------------------


def test_rollback_creates_a_new_snapshot_with_the_old_content(environment, superuser):
    first = factories.publish(environment, superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 8"))
    environment_file_put(environment=environment, kind="template", path="extra.conf",
                         text="added later\n", actor=superuser)
    second = factories.publish(environment, superuser)
    # Rolling back past extra.conf's addition empties it: the guard's confirmation.
    publication = factories.rollback_publication(first, superuser, confirmed=True)
    third = publication.snapshot
    assert publication.kind == Publication.Kind.ROLLBACK
    assert third.state == Snapshot.State.READY
    assert third.number == 3
    assert third.label.endswith("-003")
    assert third.files == first.files
    assert third.checksum == first.checksum
    assert third.effective_config == first.effective_config
    assert third.rolled_back_from == first
    assert third.parent == second
    assert counter(environment) == 3


def test_rollback_ignores_config_changed_since(environment, superuser):
    first = factories.publish(environment, superuser)
    environment_update(environment=environment, actor=superuser,
                       config="listen: 81\nserver_name: changed\nupstreams: []\n"
                              "log_level: debug\nworkers: 1\n")
    third = factories.rollback_publication(first, superuser).snapshot
    assert third.number == 2
    assert third.checksum == first.checksum
    assert third.source == first.source


def test_rollback_to_the_latest_content_still_gets_a_new_number(environment, superuser):
    first = factories.publish(environment, superuser)
    publication = factories.rollback_publication(first, superuser)
    assert publication.deduplicated is False
    assert publication.snapshot.number == 2
    assert publication.snapshot.checksum == first.checksum


def test_rollback_of_an_invalid_snapshot_is_a_conflict(environment, superuser):
    make_invalid(environment, superuser)
    invalid = factories.publish(environment, superuser)
    with pytest.raises(Conflict) as excinfo:
        snapshot_rollback(snapshot=invalid, actor=superuser)
    assert excinfo.value.code == "rollback_unavailable"
    assert Publication.objects.filter(kind=Publication.Kind.ROLLBACK).count() == 0
    assert counter(environment) == 1


# --- idempotent render -------------------------------------------------------------


def test_rendering_a_publication_twice_makes_one_snapshot(environment, superuser):
    queued = snapshot_publish(environment=environment, actor=superuser)
    assert queued.state == Publication.State.RENDERING
    first = publication_complete(publication_id=str(queued.pk))
    second = publication_complete(publication_id=str(queued.pk))
    assert first.snapshot == second.snapshot
    assert Snapshot.objects.filter(environment=environment).count() == 1
    assert counter(environment) == 1
    assert actions(environment) == ["snapshot.create"]


def test_rendering_a_rollback_twice_makes_one_snapshot(environment, superuser):
    first = factories.publish(environment, superuser)
    queued = snapshot_rollback(snapshot=first, actor=superuser)
    publication_complete(publication_id=str(queued.pk))
    publication_complete(publication_id=str(queued.pk))
    assert counter(environment) == 2
    assert actions(environment) == ["snapshot.create", "snapshot.rollback"]


def test_a_duplicate_delivery_while_a_worker_renders_renders_nothing(
        environment, superuser, django_assert_max_num_queries):
    queued = snapshot_publish(environment=environment, actor=superuser)
    Publication.objects.filter(pk=queued.pk).update(claimed_at=timezone.now())

    with django_assert_max_num_queries(2):  # the claim's UPDATE, and a read
        again = publication_complete(publication_id=str(queued.pk))

    assert again.state == Publication.State.RENDERING
    assert counter(environment) == 0


def test_a_duplicate_delivery_of_a_finished_publication_renders_nothing(
        environment, superuser, django_assert_max_num_queries):
    queued = snapshot_publish(environment=environment, actor=superuser)
    first = publication_complete(publication_id=str(queued.pk))

    with django_assert_max_num_queries(2):
        again = publication_complete(publication_id=str(queued.pk))

    assert again.state == first.state == Publication.State.READY
    assert again.claimed_at == first.claimed_at
    assert counter(environment) == 1


# --- audit -------------------------------------------------------------------------


def test_publish_rollback_and_invalid_are_audited(environment, member):
    deployer = member("deployer")
    first = factories.publish(environment, deployer)
    rolled = factories.rollback_publication(first, deployer).snapshot
    make_invalid(environment, deployer)
    invalid = factories.publish(environment, deployer)
    events = list(
        AuditEvent.objects.filter(environment=environment, action__startswith="snapshot.")
        .order_by("id")
    )
    assert [(e.action, e.object_id, e.actor, e.data["number"]) for e in events] == [
        ("snapshot.create", str(first.pk), deployer, 1),
        ("snapshot.rollback", str(rolled.pk), deployer, 2),
        ("snapshot.invalid", str(invalid.pk), deployer, 3),
    ]
    assert all(e.object_type == "snapshots.snapshot" for e in events)
    assert all(e.tenant_id == environment.application.tenant_id for e in events)
    assert events[0].data["checksum"] == first.checksum


# --- pending changes ---------------------------------------------------------------


def test_before_any_snapshot_everything_is_pending(environment):
    pending = pending_changes(fresh(environment))
    assert pending["snapshot"] is None
    assert [e.action for e in pending["events"]] == [
        "environment.create", "template.create", "template.create"
    ]
    assert pending["valid"] is True
    assert [(f["path"], f["status"]) for f in pending["files"]] == [
        ("nginx/shop.conf", "added"), ("shop/app.json", "added")
    ]


def test_nothing_is_pending_right_after_a_publish(environment, superuser):
    snapshot = factories.publish(environment, superuser)
    pending = pending_changes(fresh(environment))
    assert pending["snapshot"] == snapshot
    assert pending["events"] == []
    assert pending["files"] == []
    assert pending["valid"] is True


def test_changes_after_the_latest_snapshot_are_pending_with_their_diff(environment, superuser):
    factories.publication(environment, superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 8"))
    environment_file_put(environment=environment, kind="template", path="motd",
                         text="hello\n", actor=superuser)
    pending = pending_changes(fresh(environment))
    assert [e.action for e in pending["events"]] == ["environment.update", "template.create"]
    assert pending["events"][0].actor == superuser
    assert [(f["path"], f["status"]) for f in pending["files"]] == [
        ("motd", "added"), ("shop/app.json", "modified")
    ]
    app_diff = pending["files"][1]["diff"]
    assert '-{"log_level": "info", "workers": 4}\n' in app_diff
    assert '+{"log_level": "info", "workers": 8}\n' in app_diff


def test_pending_changes_are_delimited_by_the_latest_ready_snapshot(environment, superuser):
    factories.publication(environment, superuser)
    environment_update(environment=environment, actor=superuser, poll_interval_s=60)
    factories.publication(environment, superuser)  # nothing rendered changed: deduplicated
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 8"))
    second = factories.publish(environment, superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 6"))
    pending = pending_changes(fresh(environment))
    assert pending["snapshot"] == second
    assert [(e.action, e.data) for e in pending["events"]] == [
        ("environment.update", {"fields": ["config"]})
    ]
    assert pending["events"][0].id > AuditEvent.objects.get(
        action="snapshot.create", object_id=str(second.pk)
    ).id


def test_a_change_of_settings_alone_is_not_pending(environment, superuser):
    factories.publication(environment, superuser)
    environment_update(environment=environment, actor=superuser, poll_interval_s=90,
                       release_policy="staged")

    assert pending_changes(fresh(environment))["events"] == []
    assert AuditEvent.objects.filter(action="environment.settings").get().data == {
        "fields": ["poll_interval_s", "release_policy"]}


def test_a_change_of_config_and_settings_together_is_pending_for_the_config_only(
        environment, superuser):
    factories.publication(environment, superuser)
    environment_update(environment=environment, actor=superuser, poll_interval_s=90,
                       config=environment.config.replace("workers: 4", "workers: 6"))

    assert [(e.action, e.data) for e in pending_changes(fresh(environment))["events"]] == [
        ("environment.update", {"fields": ["config"]})]


def test_pending_changes_exclude_snapshot_events(environment, superuser):
    factories.publication(environment, superuser)
    make_invalid(environment, superuser)
    factories.publication(environment, superuser)  # invalid: the latest ready snapshot is still #1
    pending = pending_changes(fresh(environment))
    assert pending["snapshot"].number == 1
    assert [e.action for e in pending["events"]] == ["template.update", "environment.update"]


def test_pending_changes_after_a_rollback_start_at_the_rollback(environment, superuser):
    first = factories.publish(environment, superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 8"))
    factories.publication(environment, superuser)
    rolled = factories.rollback_publication(first, superuser).snapshot
    pending = pending_changes(fresh(environment))
    assert pending["snapshot"] == rolled
    assert pending["events"] == []
    # The config still says 8 workers; the rolled back snapshot has 4.
    assert [(f["path"], f["status"]) for f in pending["files"]] == [
        ("shop/app.json", "modified")
    ]


def test_a_change_made_while_a_publication_renders_stays_pending(environment, superuser):
    queued = snapshot_publish(environment=environment, actor=superuser)
    environment_update(environment=environment, actor=superuser,
                       config=environment.config.replace("workers: 4", "workers: 8"))
    snapshot = publication_complete(publication_id=str(queued.pk)).snapshot
    assert snapshot.effective_config["workers"] == 4  # captured before the change
    pending = pending_changes(fresh(environment))
    assert [(f["path"], f["status"]) for f in pending["files"]] == [
        ("shop/app.json", "modified")
    ]
    assert [e.action for e in pending["events"]] == ["environment.update"]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"config_schema": {"properties": {"workers": {"type": "string"}}}},
         ("config_schema", "config", None)),
        ({"config": "listen: 80\n"}, ("template_undefined", "nginx/shop.conf", 3)),
    ],
    ids=["schema-violation", "template-variable-missing"],
)
def test_pending_changes_report_an_invalid_current_config(environment, superuser, change,
                                                           error):
    factories.publication(environment, superuser)
    environment_update(environment=environment, actor=superuser, **change)
    pending = pending_changes(fresh(environment))
    assert pending["valid"] is False
    assert error in {(e["code"], e.get("file"), e.get("line")) for e in pending["errors"]}
    assert pending["files"] == []
    assert [e.action for e in pending["events"]] == ["environment.update"]


def test_a_publication_finishing_after_a_later_request_is_superseded(environment, superuser):
    environment_update(environment=environment, actor=superuser, config=config_with(11))
    older = snapshot_publish(environment=environment, actor=superuser)
    environment_update(environment=environment, actor=superuser, config=config_with(12))
    newer = snapshot_publish(environment=environment, actor=superuser)

    newer = publication_complete(publication_id=str(newer.pk))
    older = publication_complete(publication_id=str(older.pk))

    assert (newer.state, newer.snapshot.number) == ("ready", 1)
    assert older.state == "superseded"
    assert older.snapshot == newer.snapshot
    assert counter(environment) == 1
    assert '"workers": 12' in Snapshot.objects.get().files[1]["content"]


def test_an_unexpected_render_error_finishes_the_publication_as_invalid(environment, superuser):
    publication = snapshot_publish(environment=environment, actor=superuser)
    # A source the renderer cannot even read: a bug, not a user error.
    Publication.objects.filter(pk=publication.pk).update(source={"limits": {}})

    publication = publication_complete(publication_id=str(publication.pk))

    assert publication.state == "invalid"
    assert publication.snapshot.report["errors"][0]["code"] == "render_failed"


def test_a_deduplicated_publish_clears_pending_changes(environment, superuser):
    factories.publication(environment, superuser)
    original = fresh(environment).config
    environment_update(environment=environment, actor=superuser, config=config_with(99))
    environment_update(environment=environment, actor=superuser, config=original)
    assert len(pending_changes(environment)["events"]) == 2

    assert factories.publication(environment, superuser).deduplicated

    pending = pending_changes(environment)
    assert pending["events"] == []
    assert pending["files"] == []


def test_every_publish_request_is_audited_even_when_deduplicated(environment, superuser):
    first = factories.publication(environment, superuser)
    second = factories.publication(environment, superuser)

    requests = AuditEvent.objects.filter(environment=environment, action="publication.create")
    assert {e.object_id for e in requests} == {str(first.pk), str(second.pk)}
    assert second.inputs_audit_id == max(e.pk for e in requests)


def config_with(workers: int) -> str:
    return factories.CONFIG.replace("workers: 4", f"workers: {workers}")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_gzip_migration_compresses_existing_bundles_and_keeps_them_immutable(superuser):
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    tenant = factories.tenant(actor=superuser)
    environment = factories.environment(factories.application(tenant, actor=superuser),
                                        actor=superuser)
    snapshot = factories.publish(environment, superuser)
    executor = MigrationExecutor(connection)
    executor.migrate([("snapshots", "0006_publication_activation")])
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes())

    stored = Snapshot.objects.get(pk=snapshot.pk)
    assert gzip.decompress(bytes(stored.bundle_gzip)) == bytes(stored.bundle)
    with pytest.raises(IntegrityError), transaction.atomic():
        Snapshot.objects.filter(pk=snapshot.pk).update(bundle_gzip=b"tampered")
