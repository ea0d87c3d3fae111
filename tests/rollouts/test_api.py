"""The rollout API: every route with a positive and a negative case, the error
envelope, roles (deployer acts, viewer reads, outsiders see nothing), and the
detail's per-wave progress and current wave evidence."""

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.fleet.models import Agent
from apps.rollouts.models import Rollout, RolloutTarget
from tests.api_helpers import assert_error
from tests.factories import ack, start_rollout
from tests.rollouts.support import fresh, pins, release

pytestmark = pytest.mark.django_db

ROLLOUTS = "/api/v1/environments/shop/prod/rollouts"
MANUAL_WAVES = [{"count": 1, "gate": "manual"}, {"percent": 100, "gate": "manual"}]


def rollout_url(rollout_id: int, suffix: str = "") -> str:
    return f"/api/v1/rollouts/{rollout_id}{suffix}"


def release_url(agent_id: int) -> str:
    return f"/api/v1/agents/{agent_id}/pin/release"


@pytest.fixture
def deployer(client_for):
    return client_for("deployer")


@pytest.fixture
def viewer(client_for):
    return client_for("viewer")


@pytest.fixture
def stranger(outsider, api_client):
    """A user of another tenant: shop/prod does not exist for them."""
    return api_client(outsider)


@pytest.fixture
def nodes(fleet, second):
    return fleet(4)


@pytest.fixture
def running(environment, second, nodes):
    """A running rollout: web-1 canary (manual gate), then web-2, then web-3, web-4."""
    return start_rollout(environment, second, nodes[:1], waves=MANUAL_WAVES)


def _create_body(nodes, **extra):
    return {"snapshot": 2, "canary_agents": [nodes[0].pk], "waves": MANUAL_WAVES, **extra}


# --- POST /environments/<app>/<env>/rollouts ---------------------------------------------


def test_a_deployer_starts_a_rollout_and_gets_its_detail(deployer, nodes):
    response = deployer.post(ROLLOUTS, _create_body(nodes, bake_s=30), format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["environment"], body["snapshot"], body["state"], body["version"]) == (
        "shop/prod", 2, "running", 1)
    assert [(w["index"], w["size"], w["gate"], w["targets"], w["activated"])
            for w in body["waves"]] == [(0, 1, "manual", 1, 1), (1, 1, "manual", 1, 0),
                                        (2, 2, "manual", 2, 0)]
    assert body["waves"][0]["bake_s"] == 30
    assert body["current_wave_evidence"]["waiting"] == ["web-1"]
    assert [(t["name"], t["wave"], t["state"]) for t in body["targets"]] == [
        ("web-1", 0, "activated"), ("web-2", 1, "pending"), ("web-3", 2, "pending"),
        ("web-4", 2, "pending")]
    assert Rollout.objects.get(pk=body["id"]).created_by.username == "deployer-user"


def test_agents_are_named_by_name_or_id_wherever_ids_are_taken(deployer, nodes):
    targets = [{"agent": n.agent.name if i % 2 else n.pk,
                "expected_generation": n.fresh().generation} for i, n in enumerate(nodes)]
    response = deployer.post(ROLLOUTS, _create_body(
        nodes, canary_agents=["web-2", str(nodes[2].pk)], targets=targets), format="json")

    assert response.status_code == 201, response.content
    assert [(t["name"], t["wave"]) for t in response.json()["targets"]] == [
        ("web-2", 0), ("web-3", 0), ("web-1", 1), ("web-4", 2)]


def test_a_name_no_agent_of_the_environment_has_is_400_naming_it(deployer, nodes):
    response = deployer.post(ROLLOUTS, _create_body(nodes, canary_agents=["web-1", "web-9"]),
                             format="json")

    assert_error(response, 400, "unknown_agents")
    assert response.json()["error"]["details"] == [
        {"field": "canary_agents", "message": "no agents of shop/prod", "agents": ["web-9"]}]
    assert not Rollout.objects.exists()


def test_explicit_targets_with_a_stale_generation_are_409_listing_them(deployer, nodes):
    targets = [{"agent": n.pk, "expected_generation": n.fresh().generation} for n in nodes]
    targets[2]["expected_generation"] += 1

    response = deployer.post(ROLLOUTS, _create_body(nodes, targets=targets), format="json")

    error = assert_error(response, 409, "stale")
    assert [d["name"] for d in error["details"]] == ["web-3"]
    assert not Rollout.objects.exists()


def test_a_viewer_may_not_start_a_rollout(viewer, nodes):
    assert_error(viewer.post(ROLLOUTS, _create_body(nodes), format="json"), 403,
                 "permission_denied")


def test_an_outsider_does_not_see_the_environment(stranger, nodes):
    assert_error(stranger.post(ROLLOUTS, _create_body(nodes), format="json"), 404)
    assert_error(stranger.get(ROLLOUTS), 404)


def test_anonymous_requests_are_401(nodes):
    assert_error(APIClient().post(ROLLOUTS, _create_body(nodes), format="json"), 401)
    assert_error(APIClient().get(ROLLOUTS), 401)


@pytest.mark.parametrize("change", [
    {"waves": [{"percent": 50, "count": 2}]},
    {"waves": [{"gate": "auto"}]},
    {"waves": [{"percent": 0}]},
    {"waves": [{"count": 1, "gate": "sometimes"}]},
    {"waves": "all"},
    {"canary_agents": []},
    {"canary_agents": ["web-9"]},
    {"canary_agents": ["no such name!"]},
    {"canary_agents": [True]},
    {"canary_agents": [], "canary_labels": {"tier": "nobody"}},
    {"snapshot": "two"},
    {"failure_threshold": -1},
    {"wave_timeout_s": 10},
], ids=["percent-and-count", "neither", "zero-percent", "unknown-gate", "not-a-list",
        "no-canaries", "canary-no-such-agent", "canary-not-a-name", "canary-a-boolean",
        "labels-match-nobody", "bad-snapshot",
        "negative-threshold", "timeout-too-short"])
def test_bad_waves_or_canaries_are_400(deployer, nodes, change):
    response = deployer.post(ROLLOUTS, {**_create_body(nodes), **change}, format="json")

    assert_error(response, 400)
    assert not Rollout.objects.exists()


def test_an_unknown_snapshot_is_404(deployer, nodes):
    assert_error(deployer.post(ROLLOUTS, _create_body(nodes, snapshot=99), format="json"),
                 404)


def test_a_second_active_rollout_is_409(deployer, nodes, running):
    response = deployer.post(ROLLOUTS, _create_body(nodes), format="json")

    assert_error(response, 409, "rollout_active")


# --- GET /environments/<app>/<env>/rollouts ----------------------------------------------


def test_a_viewer_lists_the_rollouts_with_wave_progress(viewer, running, second):
    response = viewer.get(ROLLOUTS)

    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 1
    (row,) = body["results"]
    assert (row["id"], row["state"], row["current_wave"]) == (running.pk, "running", 0)
    assert [(w["targets"], w["activated"], w["released"]) for w in row["waves"]] == [
        (1, 1, 0), (1, 0, 0), (2, 0, 0)]


def _finished_rollouts(environment, snapshot, nodes, count: int) -> None:
    """`count` completed rollouts with a target per agent, straight into the database."""
    for _ in range(count):
        rollout = Rollout.objects.create(
            environment=environment, snapshot=snapshot, state="completed", version=3,
            waves=[{"size": 1, "gate": "manual", "bake_s": 0},
                   {"size": len(nodes) - 1, "gate": "auto", "bake_s": 0}],
            wave_started_at=timezone.now(), finished_at=timezone.now())
        RolloutTarget.objects.bulk_create([
            RolloutTarget(rollout=rollout, agent=n.agent, wave=min(i, 1), state="released")
            for i, n in enumerate(nodes)])


def test_listing_takes_as_many_queries_for_many_rollouts_as_for_one(
        viewer, environment, second, nodes, django_assert_max_num_queries):
    _finished_rollouts(environment, second, nodes, 1)
    viewer.get(ROLLOUTS)  # the token's first use of the day is recorded once
    with django_assert_max_num_queries(8) as one:  # (one for the scheduler's last run)
        assert viewer.get(ROLLOUTS).json()["count"] == 1

    _finished_rollouts(environment, second, nodes, 9)
    with django_assert_max_num_queries(len(one)) as ten:
        body = viewer.get(ROLLOUTS).json()

    assert body["count"] == 10
    assert len(ten) == len(one)
    assert {tuple(w["targets"] for w in r["waves"]) for r in body["results"]} == {(1, 3)}


# --- GET /rollouts/<id> ------------------------------------------------------------------


def test_the_detail_shows_wave_progress_and_the_current_waves_evidence(
        viewer, running, nodes, second):
    ack(nodes[0], second)

    response = viewer.get(rollout_url(running.pk))

    assert response.status_code == 200
    body = response.json()
    assert body["current_wave_evidence"] == {"acknowledged": ["web-1"], "failed": [],
                                             "waiting": [], "released": [], "changed": []}
    assert body["waves"][0] == {"index": 0, "size": 1, "gate": "manual", "bake_s": 0,
                                "targets": 1, "activated": 1, "released": 0,
                                "acknowledged": 1, "failed": 0}
    assert "acknowledged" not in body["waves"][1]  # counted for the current wave only
    assert {t["name"]: t["generation"] for t in body["targets"]} == {
        n.agent.name: n.fresh().generation for n in nodes}


def test_a_failed_canary_shows_in_the_evidence(viewer, running, nodes, second):
    ack(nodes[0], second, status="failed", message="nginx -t failed")

    evidence = viewer.get(rollout_url(running.pk)).json()["current_wave_evidence"]

    assert (evidence["failed"], evidence["acknowledged"]) == (["web-1"], [])


def test_a_finished_rollout_has_no_current_wave_evidence(viewer, deployer, running):
    deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 1},
                  format="json")

    body = viewer.get(rollout_url(running.pk)).json()

    assert body["state"] == "rolled_back"
    assert "current_wave_evidence" not in body


def test_an_outsider_or_unknown_rollout_is_404(stranger, viewer, running):
    assert_error(stranger.get(rollout_url(running.pk)), 404)
    assert_error(viewer.get(rollout_url(running.pk + 100)), 404)
    assert_error(APIClient().get(rollout_url(running.pk)), 401)


# --- DELETE /rollouts/<id> ---------------------------------------------------------------


def test_a_deployer_deletes_a_finished_rollout_without_pins(deployer, environment, second,
                                                            fleet):
    web1, = fleet(1)
    rollout = start_rollout(environment, second, [web1])
    ack(web1, second)
    confirm = deployer.post(rollout_url(rollout.pk, "/confirm"), {"expected_version": 1},
                            format="json")
    assert confirm.json()["state"] == "completed"

    response = deployer.delete(rollout_url(rollout.pk))

    assert response.status_code == 204
    assert not Rollout.objects.exists()


def test_deleting_an_active_rollout_is_409(deployer, running):
    assert_error(deployer.delete(rollout_url(running.pk)), 409, "rollout_active")


def test_deleting_a_rolled_back_rollout_with_pins_is_409(deployer, keep_pins, running):
    deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 1},
                  format="json")

    body = assert_error(deployer.delete(rollout_url(running.pk)), 409, "pins_remain")
    assert f"/api/v1/rollouts/{running.pk}/release-pins" in body["message"]


def test_a_rolled_back_rollout_leaves_no_pins_and_is_deleted(deployer, running):
    deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 1},
                  format="json")

    assert not Agent.objects.filter(pin_rollout=running).exists()
    assert deployer.delete(rollout_url(running.pk)).status_code == 204


def test_a_viewer_may_not_delete(viewer, running):
    assert_error(viewer.delete(rollout_url(running.pk)), 403, "permission_denied")


# --- POST /rollouts/<id>/confirm ---------------------------------------------------------


def test_confirming_an_acknowledged_wave_opens_the_next(deployer, running, nodes, second):
    ack(nodes[0], second)

    response = deployer.post(rollout_url(running.pk, "/confirm"), {"expected_version": 1},
                             format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["current_wave"], body["version"]) == (1, 2)
    assert body["current_wave_evidence"]["waiting"] == ["web-2"]
    assert pins(nodes[1:2]) == {"web-2": (2, running.pk)}


def test_confirming_at_a_stale_version_is_409(deployer, running, nodes, second):
    ack(nodes[0], second)

    error = assert_error(deployer.post(rollout_url(running.pk, "/confirm"),
                                       {"expected_version": 5}, format="json"), 409, "stale")

    assert "version 1" in error["message"]
    assert fresh(running).current_wave == 0


def test_confirming_an_unacknowledged_wave_is_409_with_the_reason(deployer, running):
    error = assert_error(deployer.post(rollout_url(running.pk, "/confirm"),
                                       {"expected_version": 1}, format="json"), 409,
                         "not_acknowledged")

    assert "web-1" in error["message"]


@pytest.mark.parametrize(("expected_version", "details"), [
    (1, [{"reason": "waiting", "agents": ["web-1"]}]),
    (5, [{"version": 1}]),
], ids=["not-acknowledged", "stale"])
def test_conflict_details_are_a_list_like_every_other_error(deployer, running,
                                                             expected_version, details):
    response = deployer.post(rollout_url(running.pk, "/confirm"),
                             {"expected_version": expected_version}, format="json")

    assert assert_error(response, 409)["details"] == details


@pytest.mark.parametrize("body", [{}, {"expected_version": 0}, {"expected_version": "x"}],
                         ids=["missing", "zero", "text"])
def test_confirm_without_a_valid_expected_version_is_400(deployer, running, body):
    assert_error(deployer.post(rollout_url(running.pk, "/confirm"), body, format="json"), 400)


def test_a_viewer_may_not_confirm(viewer, running):
    assert_error(viewer.post(rollout_url(running.pk, "/confirm"), {"expected_version": 1},
                             format="json"), 403, "permission_denied")


# --- POST /rollouts/<id>/rollback ---------------------------------------------------------


def test_rolling_back_answers_the_replacement_snapshot(deployer, running, environment,
                                                       first):
    response = deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 1},
                             format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["state"], body["rollback_snapshot"], body["version"]) == ("rolled_back", 3, 2)
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 3
    assert environment.active_snapshot.checksum == first.checksum


def test_rolling_back_at_a_stale_version_is_409(deployer, running):
    assert_error(deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 2},
                               format="json"), 409, "stale")
    assert fresh(running).state == "running"


def test_rolling_back_a_finished_rollout_is_409(deployer, running):
    deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 1},
                  format="json")

    assert_error(deployer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 2},
                               format="json"), 409, "rollout_finished")


def test_a_viewer_may_not_roll_back(viewer, running):
    assert_error(viewer.post(rollout_url(running.pk, "/rollback"), {"expected_version": 1},
                             format="json"), 403, "permission_denied")


# --- POST /agents/<id>/pin/release ---------------------------------------------------------


def _release(client, node, rollout_id, generation=None):
    generation = Agent.objects.get(pk=node.pk).generation if generation is None else generation
    return client.post(release_url(node.pk), {"expected_generation": generation,
                                              "rollout": rollout_id}, format="json")


def test_a_deployer_releases_a_rollouts_pin(deployer, running, nodes):
    response = _release(deployer, nodes[2], running.pk)

    assert response.status_code == 200, response.content
    assert response.json()["status"]["pinned"] is None
    assert pins(nodes[2:3]) == {"web-3": (None, None)}


def test_releasing_with_a_stale_generation_is_409(deployer, running, nodes):
    generation = nodes[2].fresh().generation

    error = assert_error(_release(deployer, nodes[2], running.pk, generation - 1), 409,
                         "stale")

    assert error["details"] == [{"agent": nodes[2].pk, "generation": generation}]


def test_releasing_with_an_unknown_rollout_is_404(deployer, running, nodes):
    assert_error(_release(deployer, nodes[2], running.pk + 100), 404)
    assert pins(nodes[2:3]) == {"web-3": (1, running.pk)}


def test_releasing_with_a_rollout_that_does_not_pin_the_agent_is_409(deployer, running,
                                                                      nodes):
    release(nodes[3], running)  # web-4 no longer pinned by the rollout

    assert_error(_release(deployer, nodes[3], running.pk), 409, "not_pinned")


def test_releasing_a_rollouts_pin_without_its_id_is_409(deployer, running, nodes):
    response = deployer.post(release_url(nodes[2].pk),
                             {"expected_generation": nodes[2].fresh().generation},
                             format="json")

    assert_error(response, 409, "rollout_pin")


def test_a_viewer_may_not_release(viewer, running, nodes):
    assert_error(_release(viewer, nodes[2], running.pk), 403, "permission_denied")


def test_an_outsider_may_not_release(stranger, running, nodes):
    assert_error(_release(stranger, nodes[2], running.pk), 404)


# --- bounds --------------------------------------------------------------------------------


def test_the_detail_and_its_evidence_show_at_most_100_agents(viewer, environment, second):
    Agent.objects.bulk_create([
        Agent(environment=environment, name=f"bulk-{i:03d}", token_key=f"bulk{i:012d}",
              token_hash="0" * 64) for i in range(150)])
    canaries = list(Agent.objects.order_by("pk").values_list("pk", flat=True)[:120])
    rollout = start_rollout(environment, second, canaries)

    body = viewer.get(rollout_url(rollout.pk)).json()

    assert len(body["targets"]) == 100
    assert len(body["current_wave_evidence"]["waiting"]) == 100
    assert [(w["size"], w["targets"]) for w in body["waves"]] == [(120, 120), (30, 30)]


@pytest.mark.parametrize("change", [
    {"waves": [{"count": 1}] * 51},
    {"failure_threshold": 100_001},
    {"canary_agents": list(range(1, 10_002))},
], ids=["51-waves", "threshold-over-100000", "10001-canaries"])
def test_oversized_requests_are_400(deployer, nodes, change):
    assert_error(deployer.post(ROLLOUTS, {**_create_body(nodes), **change}, format="json"),
                 400)
    assert not Rollout.objects.exists()


def test_an_environment_rollback_during_a_rollout_is_409(deployer, running, environment):
    response = deployer.post("/api/v1/environments/shop/prod/snapshots/1/rollback")

    assert_error(response, 409, "rollout_active")
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 1
    assert not environment.snapshots.filter(number=3).exists()


# --- POST /rollouts/<id>/release-pins ----------------------------------------------------


def _rolled_back(deployer, rollout) -> int:
    """Roll `rollout` back through the API; its new version."""
    response = deployer.post(rollout_url(rollout.pk, "/rollback"), {"expected_version": 1},
                             format="json")
    assert response.status_code == 200, response.content
    return response.json()["version"]


def test_a_deployer_releases_a_finished_rollouts_remaining_pins(deployer, keep_pins, running,
                                                               nodes):
    version = _rolled_back(deployer, running)
    assert Agent.objects.filter(pin_rollout=running).count() == 3  # kept: web-2..web-4
    listed = deployer.get("/api/v1/environments/shop/prod/agents").json()["results"]
    held = {a["name"]: a["status"] for a in listed}["web-2"]
    assert (held["sync"], held["held_by"]) == ("held", {"kind": "rollout",
                                                        "rollout": running.pk})

    response = deployer.post(rollout_url(running.pk, "/release-pins"),
                             {"expected_version": version}, format="json")

    assert response.status_code == 200, response.content
    assert (response.json()["version"], response.json()["pins_held"]) == (version + 1, 0)
    assert not Agent.objects.filter(pin_rollout=running).exists()
    assert fresh(running).state == "rolled_back"
    listed = deployer.get("/api/v1/environments/shop/prod/agents").json()["results"]
    assert {a["status"]["held_by"] for a in listed} == {None}


def test_releasing_pins_at_a_stale_version_is_409(deployer, keep_pins, running):
    version = _rolled_back(deployer, running)

    body = assert_error(deployer.post(rollout_url(running.pk, "/release-pins"),
                                      {"expected_version": version - 1}, format="json"),
                        409, "stale")
    assert body["details"] == [{"version": version}]
    assert Agent.objects.filter(pin_rollout=running).count() == 3


def test_releasing_pins_of_an_active_rollout_is_409(deployer, running):
    assert_error(deployer.post(rollout_url(running.pk, "/release-pins"),
                               {"expected_version": 1}, format="json"), 409, "rollout_active")


def test_releasing_pins_when_none_remain_is_409(deployer, running):
    version = _rolled_back(deployer, running)  # the default released them all

    assert_error(deployer.post(rollout_url(running.pk, "/release-pins"),
                               {"expected_version": version}, format="json"),
                 409, "not_pinned")


@pytest.mark.parametrize("body", [{}, {"expected_version": "x"}, {"expected_version": 0}])
def test_releasing_pins_without_a_valid_expected_version_is_400(deployer, running, body):
    assert_error(deployer.post(rollout_url(running.pk, "/release-pins"), body,
                               format="json"), 400)


def test_a_viewer_or_outsider_may_not_release_pins(viewer, stranger, keep_pins, deployer,
                                                   running):
    version = _rolled_back(deployer, running)
    body = {"expected_version": version}

    assert_error(viewer.post(rollout_url(running.pk, "/release-pins"), body, format="json"),
                 403, "permission_denied")
    assert_error(stranger.post(rollout_url(running.pk, "/release-pins"), body,
                               format="json"), 404)
    assert Agent.objects.filter(pin_rollout=running).count() == 3


# --- what a finished rollout keeps -------------------------------------------------------


def test_a_completed_rollout_keeps_its_per_wave_counts_and_final_evidence(
        deployer, viewer, environment, second, fleet):
    web1, web2 = fleet(2)
    rollout = start_rollout(environment, second, [web1], waves=[{"percent": 100,
                                                                 "gate": "manual"}])
    ack(web1, second)
    deployer.post(rollout_url(rollout.pk, "/confirm"), {"expected_version": 1}, format="json")
    ack(web2, second)

    confirmed = deployer.post(rollout_url(rollout.pk, "/confirm"), {"expected_version": 2},
                              format="json")
    body = viewer.get(rollout_url(rollout.pk)).json()

    assert confirmed.json()["state"] == body["state"] == "completed"
    assert [(w["targets"], w["activated"], w["acknowledged"], w["failed"])
            for w in body["waves"]] == [(1, 1, 1, 0), (1, 1, 1, 0)]
    assert body["final_evidence"]["acknowledged"] == ["web-2"]
    assert body["pins_held"] == 0


def test_a_rolled_back_rollout_keeps_the_failure_that_ended_it(deployer, viewer, running,
                                                               nodes, second):
    said = "#2 failed (validate exited 1: bad marker); nothing was changed, #1 stays"
    ack(nodes[0], second, status="failed", message=said)
    failure = {"agent": "web-1", "status": "failed", "message": said}
    assert viewer.get(rollout_url(running.pk)).json()["failures"] == [failure]  # while it runs
    _rolled_back(deployer, running)
    ack(nodes[0], second, status="succeeded")  # later reports change nothing it kept

    body = viewer.get(rollout_url(running.pk)).json()

    assert (body["waves"][0]["activated"], body["waves"][0]["failed"]) == (1, 1)
    assert body["final_evidence"]["failed"] == ["web-1"]
    assert body["failures"] == [failure]
