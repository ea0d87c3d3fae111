"""GET .../pending (changes since the latest ready snapshot) and GET .../audit."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.services import environment_file_put
from tests.api.support import ENV
from tests.api_helpers import assert_error
from tests.factories import publish


def test_pending_without_any_snapshot_lists_every_change_and_all_files_added(environment,
                                                                            client_for):
    response = client_for("viewer").get(f"{ENV}/pending")

    assert response.status_code == 200
    body = response.json()
    assert body["snapshot"] is None
    assert [e["action"] for e in body["events"]] == [
        "environment.create", "template.create", "template.create"
    ]
    assert body["count"] == 3
    assert body["valid"] is True
    assert [(f["path"], f["status"]) for f in body["files"]] == [
        ("nginx/shop.conf", "added"), ("shop/app.json", "added")
    ]


def test_pending_right_after_a_publish_is_empty(environment, superuser, client_for):
    snapshot = publish(environment, superuser)

    body = client_for("viewer").get(f"{ENV}/pending").json()

    assert body["snapshot"] == {"number": snapshot.number, "label": snapshot.label}
    assert (body["count"], body["events"], body["files"]) == (0, [], [])


def test_pending_lists_changes_since_the_latest_snapshot_and_their_diff(environment, superuser,
                                                                       client_for):
    publish(environment, superuser)
    owner = client_for("owner")
    owner.patch(ENV, {"config": environment.config.replace("workers: 4", "workers: 6")},
                format="json")

    body = owner.get(f"{ENV}/pending").json()

    assert body["count"] == 1
    (event,) = body["events"]
    assert (event["action"], event["actor"]) == ("environment.update", "owner-user")
    (change,) = body["files"]
    assert (change["path"], change["status"]) == ("shop/app.json", "modified")
    assert '+{"log_level": "info", "workers": 6}' in change["diff"]


def test_pending_of_a_config_that_would_not_render_lists_its_problems(environment, superuser,
                                                                     client_for):
    publish(environment, superuser)
    environment_file_put(environment=environment, kind="template", path="x.conf",
                         text="{{ nope }}\n", actor=superuser)

    body = client_for("viewer").get(f"{ENV}/pending").json()

    assert body["valid"] is False
    assert body["files"] == []
    assert body["errors"][0]["code"] == "template_undefined"
    assert body["errors"][0]["file"] == "x.conf"
    assert [e["action"] for e in body["events"]] == ["template.create"]


def test_pending_records_nothing(environment, client_for):
    client = client_for("viewer")
    before = AuditEvent.objects.count()

    client.get(f"{ENV}/pending")

    assert AuditEvent.objects.count() == before


def test_pending_of_missing_environment_is_404(environment, client_for):
    assert_error(client_for("viewer").get("/api/v1/environments/shop/dev/pending"), 404,
                 "not_found")


def test_audit_lists_the_environments_events_newest_first(environment, superuser,
                                                         client_for):
    publish(environment, superuser)

    response = client_for("viewer").get(f"{ENV}/audit")

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 5
    assert [e["action"] for e in body["results"]] == [
        "snapshot.create", "publication.create", "template.create", "template.create",
        "environment.create",
    ]
    newest = body["results"][0]
    assert newest["actor"] == "root"
    assert newest["object_type"] == "snapshots.snapshot"
    assert newest["data"]["number"] == 1
    assert set(newest) == {"id", "actor", "action", "object_type", "object_id", "object_repr",
                           "summary", "data", "created_at"}


def test_audit_shows_only_this_environments_events(environment, outsider, client_for):
    results = client_for("viewer").get(f"{ENV}/audit").json()["results"]

    created = {e["object_repr"] for e in results if e["action"] == "environment.create"}
    assert created == {"shop/prod"}
    assert AuditEvent.objects.filter(action="environment.create").count() == 2
    assert "membership.set" not in {e["action"] for e in results}


def test_audit_is_paginated(environment, client_for):
    body = client_for("viewer").get(f"{ENV}/audit?limit=2").json()

    assert body["count"] == 3
    assert len(body["results"]) == 2
    assert body["next"] is not None


@pytest.mark.parametrize("path", ["/api/v1/environments/shop/dev/audit",
                                  "/api/v1/environments/blog/prod/audit"])
def test_audit_of_an_invisible_environment_is_404(path, environment, outsider, client_for):
    assert_error(client_for("viewer").get(path), 404, "not_found")
