"""A published snapshot's bundle carries the secrets manifest (configlang/secrets.py);
a descriptor's attempt to form a reference makes an invalid snapshot, never a bundle."""

import json

from agent.apply import content_checksum as agent_checksum
from apps.releases import services as releases
from apps.snapshots.models import Snapshot
from configlang.rendering import content_checksum
from tests import factories

CONFIG = """listen: 80
secrets:
  db: env:SHOP_DB
params:
  banner: hello
"""
TEMPLATES = {"app.conf": "db={{ secrets.db }}\nbanner={{ params.banner }}\n"}


def test_the_bundle_lists_the_placeholders_an_agent_may_resolve(application, superuser):
    environment = factories.environment(application, actor=superuser, config=CONFIG,
                                        templates=TEMPLATES)

    snapshot = factories.publish(environment, superuser)

    assert snapshot.state == Snapshot.State.READY, snapshot.report
    bundle = json.loads(bytes(snapshot.bundle))
    [entry] = bundle["secrets"]
    assert entry["reference"] == "env:SHOP_DB" and entry["files"] == ["app.conf"]
    assert entry["placeholder"].startswith("${secret:sealed:")
    assert bundle["files"][0]["content"] == f"db={entry['placeholder']}\nbanner=hello\n"
    assert snapshot.report["secrets"] == [{"reference": "env:SHOP_DB", "files": ["app.conf"]}]


def test_a_rollback_reproduces_the_placeholders_exactly(application, superuser):
    environment = factories.environment(application, actor=superuser, config=CONFIG,
                                        templates=TEMPLATES)
    first = factories.publish(environment, superuser)

    again = factories.rollback_publication(first, superuser).snapshot

    assert again.number == first.number + 1
    assert again.checksum == first.checksum
    assert json.loads(bytes(again.bundle))["secrets"] == json.loads(bytes(first.bundle))["secrets"]


def test_reference_text_in_the_environments_params_rendered_altered_is_invalid(
        application, superuser):
    templates = {"app.conf": "x\n{{ params.banner ~ secrets.db[:-1] }}\n"}
    environment = factories.environment(application, actor=superuser, config=CONFIG,
                                        templates=templates)

    snapshot = factories.publish(environment, superuser)

    assert snapshot.state == Snapshot.State.INVALID
    assert bytes(snapshot.bundle) == b""
    [error] = snapshot.report["errors"]
    assert (error["code"], error["file"], error["line"]) == ("secret_reference", "app.conf", 2)


def test_the_bundle_carries_the_declared_secret_file_mode_under_its_checksum(
        application, superuser):
    environment = factories.environment(application, actor=superuser,
                                        config=CONFIG + 'secret_file_mode: "640"\n',
                                        templates=TEMPLATES)

    snapshot = factories.publish(environment, superuser)

    assert snapshot.state == Snapshot.State.READY, snapshot.report
    bundle = json.loads(bytes(snapshot.bundle))
    assert bundle["secret_file_mode"] == "0640"
    assert bundle["checksum"] == snapshot.checksum == content_checksum(snapshot.files, "0640")
    assert agent_checksum(bundle["files"], bundle["secret_file_mode"]) == snapshot.checksum
    assert snapshot.report["secret_file_mode"] == "0640"


def test_without_a_declared_mode_the_bundle_has_none_and_the_checksum_is_the_files(
        application, superuser):
    environment = factories.environment(application, actor=superuser, config=CONFIG,
                                        templates=TEMPLATES)

    bundle = json.loads(bytes(factories.publish(environment, superuser).bundle))

    assert "secret_file_mode" not in bundle
    assert bundle["checksum"] == content_checksum(bundle["files"])


def test_changing_only_the_mode_publishes_new_content_and_a_rollback_brings_it_back(
        application, superuser):
    environment = factories.environment(application, actor=superuser, config=CONFIG,
                                        templates=TEMPLATES)
    first = factories.publish(environment, superuser)
    environment = releases.environment_update(
        environment=environment, config=CONFIG + 'secret_file_mode: "0440"\n',
        actor=superuser)

    second = factories.publish(environment, superuser)
    back = factories.rollback_publication(second, superuser).snapshot

    assert second.state == Snapshot.State.READY and second.number == first.number + 1
    assert content_checksum(second.files) == first.checksum != second.checksum  # same files
    assert back.checksum == second.checksum
    assert json.loads(bytes(back.bundle))["secret_file_mode"] == "0440"


def test_a_mode_letting_others_read_makes_an_invalid_snapshot_naming_the_key(
        application, superuser):
    environment = factories.environment(application, actor=superuser, config=CONFIG,
                                        templates=TEMPLATES)
    # Stored past the config check (an older server's config, or the raw model).
    type(environment).objects.filter(pk=environment.pk).update(
        config=CONFIG + 'secret_file_mode: "0644"\n')
    environment.refresh_from_db()

    snapshot = factories.publish(environment, superuser)

    assert snapshot.state == Snapshot.State.INVALID
    assert bytes(snapshot.bundle) == b""
    [error] = snapshot.report["errors"]
    assert (error["code"], error["key"]) == ("secret_file_mode", "secret_file_mode")
