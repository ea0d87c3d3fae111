"""POST /api/v1/agent/reports with the agent's health probe: stored on the deployment,
shown as the agent's last health and in its deployments; a malformed `health` is a
400 naming the field, and nothing is written."""

import pytest

from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from tests.api_helpers import assert_error
from tests.factories import publish_variant
from tests.fleet.support import AGENTS, REPORTS, agent_url

HEALTHY = {"ok": True, "attempts": 1, "output": "HTTP 200: ok", "probe": "url"}
UNHEALTHY = {"ok": False, "attempts": 3, "probe": "command",
             "output": "exited 1: upstream shop: 502 Bad Gateway"}


def body(snapshot, status="succeeded", message="", health=None, deployment_id=None) -> dict:
    sent = {"deployment_id": None if deployment_id is None else str(deployment_id),
            "snapshot": snapshot.number, "checksum": snapshot.checksum, "status": status,
            "message": message}
    if health is not None:
        sent["health"] = health
    return sent


def test_a_pull_report_keeps_its_health_on_the_deployment_and_the_agent(
        enroll, first, environment, superuser, client_for):
    agent = enroll()
    agent.client.post(REPORTS, body(first, health=HEALTHY), format="json")
    second = publish_variant(environment, superuser, workers=8)

    response = agent.client.post(REPORTS, body(
        second, "warning", "#2 failed (health command failed after 3 attempt(s)); restored #1",
        UNHEALTHY), format="json")

    assert response.status_code == 201
    deployment = Deployment.objects.get(pk=response.json()["deployment_id"])
    assert (deployment.state, deployment.health) == ("warning", UNHEALTHY)
    viewer = client_for("viewer")
    status = viewer.get(agent_url(agent.agent.pk)).json()["status"]
    assert (status["last_status"], status["last_health"]) == ("warning", UNHEALTHY)
    assert status["blocked"]["number"] == 2 and status["applied"]["number"] == 1
    listed = viewer.get(agent_url(agent.agent.pk, "/deployments")).json()["results"]
    assert {d["snapshot"]: d["health"] for d in listed} == {1: HEALTHY, 2: UNHEALTHY}
    row = viewer.get(AGENTS).json()["results"][0]
    assert row["status"]["last_health"] == UNHEALTHY


def test_a_push_report_keeps_its_health(enroll, first, superuser, client_for):
    agent = enroll(mode="manual")
    [deployment] = releases.snapshot_deploy(snapshot=first, agent_ids=[agent.agent.pk],
                                            actor=superuser)

    response = agent.client.post(REPORTS, body(first, health=HEALTHY,
                                               deployment_id=deployment.pk), format="json")

    assert (response.status_code, response.json()["deployment_id"]) == (201, str(deployment.pk))
    deployment.refresh_from_db()
    assert (deployment.state, deployment.health) == ("succeeded", HEALTHY)


def test_a_report_without_health_clears_the_agents_last_health(enroll, first, environment,
                                                               superuser):
    agent = enroll()
    agent.client.post(REPORTS, body(first, health=HEALTHY), format="json")
    second = publish_variant(environment, superuser, workers=8)

    response = agent.client.post(REPORTS, {**body(second), "health": None}, format="json")

    assert response.status_code == 201
    assert Deployment.objects.get(pk=response.json()["deployment_id"]).health is None
    assert agent.fresh().last_health is None  # the last report ran no probe


def test_a_duplicate_report_with_health_changes_nothing(enroll, first):
    agent = enroll()
    sent = body(first, "failed", "unhealthy", UNHEALTHY)
    created = agent.client.post(REPORTS, sent, format="json").json()

    response = agent.client.post(REPORTS, sent, format="json")

    assert (response.status_code, response.json()) == (200, {**created, "duplicate": True})
    assert Deployment.objects.count() == 1


def test_the_longest_output_is_kept_whole(enroll, first):
    agent = enroll()
    health = {**UNHEALTHY, "output": "é" * 2000}

    response = agent.client.post(REPORTS, body(first, "failed", "x", health), format="json")

    assert response.status_code == 201
    assert Deployment.objects.get().health["output"] == "é" * 2000


@pytest.mark.parametrize(("health", "field"), [
    ("healthy", "health"),
    ([HEALTHY], "health"),
    (True, "health"),
    ({**HEALTHY, "ok": "true"}, "health.ok"),
    ({**HEALTHY, "ok": 1}, "health.ok"),
    ({**HEALTHY, "ok": None}, "health.ok"),
    ({**HEALTHY, "attempts": 0}, "health.attempts"),
    ({**HEALTHY, "attempts": -1}, "health.attempts"),
    ({**HEALTHY, "attempts": 1001}, "health.attempts"),
    ({**HEALTHY, "attempts": "3"}, "health.attempts"),
    ({**HEALTHY, "attempts": 2.5}, "health.attempts"),
    ({**HEALTHY, "attempts": True}, "health.attempts"),
    ({**HEALTHY, "attempts": 10 ** 30}, "health.attempts"),
    ({**HEALTHY, "output": "x" * 2001}, "health.output"),
    ({**HEALTHY, "output": 500}, "health.output"),
    ({**HEALTHY, "output": ["a"]}, "health.output"),
    ({**HEALTHY, "output": "before\u0000after"}, "health.output"),
    ({**HEALTHY, "probe": "http"}, "health.probe"),
    ({**HEALTHY, "probe": ""}, "health.probe"),
    ({k: v for k, v in HEALTHY.items() if k != "ok"}, "health.ok"),
    ({k: v for k, v in HEALTHY.items() if k != "probe"}, "health.probe"),
], ids=lambda value: str(value)[:24])
def test_a_malformed_health_is_400_naming_the_field_and_writes_nothing(
        health, field, enroll, first):
    agent = enroll()

    response = agent.client.post(REPORTS, body(first, health=health), format="json")

    error = assert_error(response, 400)
    assert field in {d["field"] for d in error["details"]}, error
    assert error["message"].startswith(f"{field}: ")
    assert not Deployment.objects.exists()
    fresh = agent.fresh()
    assert (fresh.last_status, fresh.last_health, fresh.applied_number) == ("", None, None)


def test_listing_agents_with_health_costs_no_more_queries(
        enroll, first, client_for, django_assert_max_num_queries):
    viewer = client_for("viewer")
    one = enroll("web-0")
    one.client.post(REPORTS, body(first, health=UNHEALTHY), format="json")
    viewer.get(AGENTS)  # the viewer's token is looked up once and cached like any other
    with django_assert_max_num_queries(50) as captured:
        assert viewer.get(AGENTS).json()["count"] == 1
    few = len(captured)  # counted now: a later request resets the connection's log
    for index in range(1, 6):
        enroll(f"web-{index}").client.post(REPORTS, body(first, health=HEALTHY),
                                           format="json")

    with django_assert_max_num_queries(few):
        rows = viewer.get(AGENTS).json()["results"]

    assert [r["status"]["last_health"]["ok"] for r in rows] == [False] + [True] * 5
    assert Agent.objects.filter(last_health__isnull=False).count() == 6
