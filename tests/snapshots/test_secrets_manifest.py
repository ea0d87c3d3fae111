"""A published snapshot's bundle carries the secrets manifest (configlang/secrets.py);
a descriptor's attempt to form a reference makes an invalid snapshot, never a bundle."""

import json

from apps.snapshots.models import Snapshot
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
