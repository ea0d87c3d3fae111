"""Preview, publish, publications, snapshot list/detail/diff and rollback.

Publish and rollback render on commit, which never comes inside the default test
transaction: tests that expect the finished result use transaction=True.
"""

import re
import uuid
from datetime import timedelta

import pytest

from apps.audit.models import AuditEvent
from apps.environments.services import environment_file_put
from apps.releases.services import environment_update
from apps.releases.tasks import publication_render_task
from apps.snapshots.models import Publication, Snapshot
from tests.api.support import ENV
from tests.api_helpers import assert_error
from tests.factories import publish, publish_variant

transactional = pytest.mark.django_db(transaction=True)

SNAPSHOT_SUMMARY_FIELDS = {"number", "label", "state", "checksum", "author", "parent",
                           "rolled_back_from", "active", "quarantined", "created_at"}


@pytest.fixture
def broken(environment, superuser):
    """shop/prod with three problems a render finds (none a save-time check catches)."""
    environment_file_put(environment=environment, kind="template", path="bad/undefined.conf",
                         text="ok\nvalue = {{ missing_key }}\n", actor=superuser)
    environment_file_put(environment=environment, kind="template", path="shop/app.json",
                         text='{"workers": {{ workers }},}\n', actor=superuser)
    return environment_update(
        environment=environment,
        config_schema={"type": "object", "required": ["database_url"]},
        actor=superuser,
    )


def _counts():
    return Snapshot.objects.count(), Publication.objects.count(), AuditEvent.objects.count()


# -- preview ----------------------------------------------------------------------------------


def test_preview_renders_the_current_config_and_records_nothing(environment, client_for):
    client = client_for("viewer")
    before = _counts()

    response = client.get(f"{ENV}/preview")

    assert response.status_code == 200
    body = response.json()
    assert body["valid"] is True
    assert body["errors"] == []
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", body["checksum"])
    assert [f["path"] for f in body["files"]] == ["nginx/shop.conf", "shop/app.json"]
    assert "server_name shop.example.com;" in body["files"][0]["content"]
    assert body["effective_config"]["workers"] == 4
    assert _counts() == before
    environment.refresh_from_db()
    assert environment.snapshot_counter == 0


def test_preview_checksum_is_the_checksum_publish_then_stores(environment, client_for,
                                                             superuser):
    preview = client_for("viewer").get(f"{ENV}/preview").json()

    snapshot = publish(environment, superuser)

    assert snapshot.checksum == preview["checksum"]
    assert snapshot.files == preview["files"]


def test_preview_of_invalid_config_lists_every_problem_and_records_nothing(broken,
                                                                          client_for):
    client = client_for("viewer")
    before = _counts()

    response = client.get(f"{ENV}/preview")

    assert response.status_code == 200
    body = response.json()
    assert body["valid"] is False
    assert body["checksum"] is None
    assert {p["code"] for p in body["errors"]} == {"config_schema", "template_undefined",
                                                   "file_json"}
    undefined = next(p for p in body["errors"] if p["code"] == "template_undefined")
    assert (undefined["file"], undefined["line"]) == ("bad/undefined.conf", 2)
    assert _counts() == before


def test_preview_of_missing_environment_is_404(environment, client_for):
    assert_error(client_for("viewer").get("/api/v1/environments/shop/qa/preview"), 404,
                 "not_found")


# -- publish ----------------------------------------------------------------------------------


@transactional
def test_publish_creates_snapshot_1_with_201_and_its_location(environment, client_for):
    response = client_for("deployer").post(f"{ENV}/publish")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["state"] == "ready"
    assert body["kind"] == "publish"
    assert body["deduplicated"] is False
    assert body["errors"] == []
    assert body["snapshot"]["number"] == 1
    assert re.fullmatch(r"\d{8}-001", body["snapshot"]["label"])
    assert response["Location"] == f"{ENV}/snapshots/1"
    detail = client_for("viewer").get(response["Location"])
    assert detail.status_code == 200
    assert detail.json()["checksum"] == body["snapshot"]["checksum"]
    assert detail.json()["author"] == "deployer-user"


@transactional
def test_publishing_identical_content_twice_returns_200_with_the_same_snapshot(environment,
                                                                              client_for):
    client = client_for("deployer")

    first = client.post(f"{ENV}/publish")
    second = client.post(f"{ENV}/publish")

    assert first.status_code == 201
    assert second.status_code == 200
    assert second.json()["deduplicated"] is True
    assert second.json()["snapshot"] == first.json()["snapshot"]
    assert second["Location"] == f"{ENV}/snapshots/1"
    assert Snapshot.objects.count() == 1
    environment.refresh_from_db()
    assert environment.snapshot_counter == 1


@transactional
def test_publishing_changed_content_creates_the_next_number(environment, client_for):
    owner = client_for("owner")
    first = owner.post(f"{ENV}/publish")
    owner.patch(ENV, {"config": environment.config.replace("workers: 4", "workers: 9")},
                format="json")

    second = owner.post(f"{ENV}/publish")

    assert first.status_code == second.status_code == 201
    assert second.json()["snapshot"]["number"] == 2
    assert second.json()["snapshot"]["checksum"] != first.json()["snapshot"]["checksum"]
    assert re.fullmatch(r"\d{8}-002", second.json()["snapshot"]["label"])


@transactional
def test_publish_of_invalid_config_is_400_snapshot_invalid_naming_every_problem(broken,
                                                                               client_for):
    response = client_for("deployer").post(f"{ENV}/publish")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "snapshot_invalid"
    codes = sorted(p["code"] for p in error["details"])
    assert codes == ["config_schema", "file_json", "template_undefined"]
    by_code = {p["code"]: p for p in error["details"]}
    assert (by_code["template_undefined"]["file"],
            by_code["template_undefined"]["line"]) == ("bad/undefined.conf", 2)
    assert (by_code["file_json"]["file"], by_code["file_json"]["line"]) == ("shop/app.json", 1)
    assert "3 problem(s)" in error["message"]
    snapshot = Snapshot.objects.get()
    assert (snapshot.number, snapshot.state, snapshot.files) == (1, "invalid", [])
    assert AuditEvent.objects.filter(action="snapshot.invalid").count() == 1


@transactional
def test_snapshot_invalid_body_is_exactly_the_error_envelope(broken, client_for):
    response = client_for("deployer").post(f"{ENV}/publish")

    error = assert_error(response, 400, "snapshot_invalid")
    assert len(error["details"]) == 3


@transactional
def test_a_viewer_may_not_publish(environment, client_for):
    response = client_for("viewer").post(f"{ENV}/publish")

    error = assert_error(response, 403, "permission_denied")
    assert "deployer" in error["message"]
    assert Publication.objects.count() == 0
    assert Snapshot.objects.count() == 0


def test_publish_answers_202_with_the_publication_while_rendering(
    environment, client_for, django_capture_on_commit_callbacks
):
    client = client_for("deployer")

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post(f"{ENV}/publish")

    assert response.status_code == 202
    body = response.json()
    assert body["state"] == "rendering"
    assert body["snapshot"] is None
    assert response["Location"] == f"/api/v1/publications/{body['id']}"
    renders = [c for c in callbacks if getattr(c, "task", None) is publication_render_task]
    assert len(renders) == 1  # the render, queued on commit
    finished = client.get(response["Location"])
    assert finished.status_code == 200
    assert finished.json()["state"] == "ready"
    assert finished.json()["snapshot"]["number"] == 1


@pytest.mark.parametrize("finished_first", ["original", "retry"])
def test_a_publish_retried_after_a_timeout_stores_no_second_snapshot(
        environment, client_for, finished_first):
    """A client that timed out retries: the retry is a request of its own, but it
    captures the same inputs, so whichever render finishes second matches the
    first's snapshot (deduplicated) or was requested earlier (superseded)."""
    from apps.releases.publishing import publication_complete

    client = client_for("deployer")
    original = client.post(f"{ENV}/publish").json()["id"]
    retry = client.post(f"{ENV}/publish")
    assert retry.status_code == 202
    order = [original, retry.json()["id"]]
    if finished_first == "retry":
        order.reverse()

    finished = [publication_complete(publication_id=pk) for pk in order]

    assert Snapshot.objects.filter(environment=environment).count() == 1
    assert finished[0].snapshot == finished[1].snapshot
    second = client.get(f"/api/v1/publications/{order[1]}").json()
    assert (second["state"], second["deduplicated"]) in {("ready", True), ("superseded", False)}


# -- publications -----------------------------------------------------------------------------


def test_publication_shows_its_state_and_snapshot(snapshots, route_url, client_for):
    response = client_for("viewer").get(route_url("/api/v1/publications/{publication}"))

    assert response.status_code == 200
    body = response.json()
    assert body["environment"] == "shop/prod"
    assert body["kind"] == "publish"
    assert body["state"] == "ready"
    assert body["snapshot"]["number"] == 2
    assert body["snapshot"]["url"] == f"{ENV}/snapshots/2"
    assert body["url"] == f"/api/v1/publications/{body['id']}"


def test_a_publication_says_it_waits_for_a_worker_then_that_it_renders(environment,
                                                                      client_for):
    client = client_for("deployer")
    response = client.post(f"{ENV}/publish")  # on-commit callbacks do not run here
    body = response.json()
    created = Publication.objects.get(pk=body["id"]).created_at
    assert body["claimed_at"] is None
    assert body["progress"] == (
        f"waiting for a worker since {created:%Y-%m-%d %H:%M:%S} UTC")

    claimed = created + timedelta(seconds=7)
    Publication.objects.filter(pk=body["id"]).update(claimed_at=claimed)
    body = client.get(response["Location"]).json()
    assert body["state"] == "rendering"
    assert body["progress"] == f"rendering since {claimed:%Y-%m-%d %H:%M:%S} UTC"
    assert body["claimed_at"] is not None


def test_a_finished_publication_has_no_progress(snapshots, route_url, client_for):
    body = client_for("viewer").get(route_url("/api/v1/publications/{publication}")).json()
    assert body["state"] == "ready"
    assert body["progress"] is None
    assert body["claimed_at"] is not None  # rendered by a (here, inline) worker


def test_publication_of_an_invalid_render_lists_its_problems(broken, superuser, client_for):
    publication = Publication.objects.get(snapshot=publish(broken, superuser))

    response = client_for("viewer").get(f"/api/v1/publications/{publication.pk}")

    assert response.status_code == 200
    assert response.json()["state"] == "invalid"
    assert len(response.json()["errors"]) == 3


def test_unknown_publication_is_404(snapshots, client_for):
    response = client_for("viewer").get(f"/api/v1/publications/{uuid.uuid4()}")

    assert_error(response, 404, "not_found")


# -- list and detail --------------------------------------------------------------------------


def test_snapshot_list_is_newest_first_without_files(snapshots, client_for):
    response = client_for("viewer").get(f"{ENV}/snapshots")

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    assert [s["number"] for s in body["results"]] == [2, 1]
    for item in body["results"]:
        assert set(item) == SNAPSHOT_SUMMARY_FIELDS
        assert item["state"] == "ready"
        assert item["author"] == "root"
    assert body["results"][0]["parent"] == 1
    assert body["results"][1]["parent"] is None


def test_snapshot_list_is_paginated(snapshots, client_for):
    body = client_for("viewer").get(f"{ENV}/snapshots?limit=1&offset=1").json()

    assert body["count"] == 2
    assert [s["number"] for s in body["results"]] == [1]
    assert body["previous"] is not None


def test_snapshot_list_of_environment_without_snapshots_is_empty(environment, client_for):
    body = client_for("viewer").get(f"{ENV}/snapshots").json()

    assert (body["count"], body["results"]) == (0, [])


@pytest.mark.parametrize("count", [2, 6])
def test_snapshot_list_query_count_does_not_grow_with_the_number_of_snapshots(
    count, environment, superuser, client_for, django_assert_num_queries
):
    client = client_for("viewer")
    client.get(f"{ENV}/snapshots")  # settles the token's last_used_at write
    for workers in range(count):
        publish_variant(environment, superuser, workers=workers + 10)

    # token, environment, its owners, the membership, count, page
    with django_assert_num_queries(7):  # + the environment's quarantines
        response = client.get(f"{ENV}/snapshots")

    assert response.json()["count"] == count
    assert len(response.json()["results"]) == count


def test_snapshot_detail_has_files_config_report_and_source(snapshots, client_for):
    response = client_for("viewer").get(f"{ENV}/snapshots/2")

    assert response.status_code == 200
    body = response.json()
    assert body["number"] == 2
    assert body["parent"] == 1
    assert body["rolled_back_from"] is None
    assert [f["path"] for f in body["files"]] == ["nginx/shop.conf", "shop/app.json"]
    assert '"workers": 8' in body["files"][1]["content"]
    assert body["fallback_files"] == [{"path": "www/index.html",
                                       "content": "<p>maintenance</p>\n"}]
    assert body["effective_config"]["workers"] == 8
    assert body["report"]["valid"] is True
    assert body["source"]["environment"] == "prod"
    assert body["checksum"] == snapshots[1].checksum


@pytest.mark.parametrize("number", [0, 3, 999999])
def test_unknown_snapshot_number_is_404(number, snapshots, client_for):
    response = client_for("viewer").get(f"{ENV}/snapshots/{number}")

    error = assert_error(response, 404, "not_found")
    assert str(number) in error["message"]


# -- diff -------------------------------------------------------------------------------------


def test_diff_defaults_to_the_previous_snapshot(snapshots, client_for):
    response = client_for("viewer").get(f"{ENV}/snapshots/2/diff")

    assert response.status_code == 200
    body = response.json()
    assert (body["snapshot"], body["against"]) == (2, 1)
    (change,) = body["files"]
    assert (change["path"], change["status"]) == ("shop/app.json", "modified")
    assert '-{"log_level": "info", "workers": 4}' in change["diff"]
    assert '+{"log_level": "info", "workers": 8}' in change["diff"]


def test_diff_against_a_chosen_snapshot(snapshots, client_for):
    body = client_for("viewer").get(f"{ENV}/snapshots/1/diff?against=2").json()

    assert (body["snapshot"], body["against"]) == (1, 2)
    assert '+{"log_level": "info", "workers": 4}' in body["files"][0]["diff"]


def test_diff_of_the_first_snapshot_shows_every_file_added(snapshots, client_for):
    body = client_for("viewer").get(f"{ENV}/snapshots/1/diff").json()

    assert body["against"] is None
    assert [(f["path"], f["status"]) for f in body["files"]] == [
        ("nginx/shop.conf", "added"), ("shop/app.json", "added")
    ]


def test_diff_against_itself_is_empty(snapshots, client_for):
    body = client_for("viewer").get(f"{ENV}/snapshots/2/diff?against=2").json()

    assert body["files"] == []


@pytest.mark.parametrize("against", ["0", "-1", "abc", "1.5", "1e3"])
def test_diff_against_a_value_that_is_not_a_snapshot_number_is_400(against, snapshots,
                                                                  client_for):
    response = client_for("viewer").get(f"{ENV}/snapshots/2/diff?against={against}")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "against"


def test_diff_against_an_unknown_snapshot_is_404(snapshots, client_for):
    response = client_for("viewer").get(f"{ENV}/snapshots/2/diff?against=7")

    error = assert_error(response, 404, "not_found")
    assert "7" in error["message"]


def test_diff_of_an_unknown_snapshot_is_404(snapshots, client_for):
    assert_error(client_for("viewer").get(f"{ENV}/snapshots/9/diff"), 404, "not_found")


# -- rollback ---------------------------------------------------------------------------------


@transactional
def test_rollback_creates_a_new_snapshot_with_the_old_content(snapshots, client_for):
    first, second = snapshots

    response = client_for("deployer").post(f"{ENV}/snapshots/1/rollback")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["kind"] == "rollback"
    assert body["snapshot"]["number"] == 3
    assert body["snapshot"]["checksum"] == first.checksum
    assert response["Location"] == f"{ENV}/snapshots/3"
    rolled = Snapshot.objects.get(number=3)
    assert rolled.rolled_back_from == first
    assert rolled.parent == second
    assert rolled.files == first.files
    assert rolled.source == first.source
    detail = client_for("viewer").get(f"{ENV}/snapshots/3").json()
    assert (detail["rolled_back_from"], detail["parent"]) == (1, 2)
    assert AuditEvent.objects.filter(action="snapshot.rollback").count() == 1


@transactional
def test_rollback_to_the_latest_snapshot_still_creates_a_new_number(snapshots, client_for):
    response = client_for("deployer").post(f"{ENV}/snapshots/2/rollback")

    assert response.status_code == 201
    assert response.json()["snapshot"]["number"] == 3
    assert response.json()["deduplicated"] is False


@transactional
def test_rollback_of_an_invalid_snapshot_is_409(broken, superuser, client_for):
    invalid = publish(broken, superuser)
    assert invalid.state == "invalid"

    response = client_for("deployer").post(f"{ENV}/snapshots/{invalid.number}/rollback")

    assert_error(response, 409, "rollback_unavailable")
    assert Snapshot.objects.count() == 1
    assert Publication.objects.filter(kind="rollback").count() == 0


@transactional
def test_a_viewer_may_not_roll_back(snapshots, client_for):
    response = client_for("viewer").post(f"{ENV}/snapshots/1/rollback")

    assert_error(response, 403, "permission_denied")
    assert Snapshot.objects.count() == 2


@transactional
def test_rollback_of_an_unknown_snapshot_is_404(snapshots, client_for):
    response = client_for("deployer").post(f"{ENV}/snapshots/5/rollback")

    assert_error(response, 404, "not_found")
    assert Snapshot.objects.count() == 2
