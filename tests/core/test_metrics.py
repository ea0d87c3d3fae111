"""GET /metrics (project/metrics.py): who may read it, what it counts, what it costs;
and request ids in the logs (project/requestid.py)."""

import io
import json
import logging

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.test import Client
from django.test.utils import override_settings
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from pythonjsonlogger.json import JsonFormatter

from apps.core import metrics as counters
from project import metrics as endpoint
from project import requestid
from project.env import env_networks
from tests import factories
from tests.factories import poll
from tests.fleet.support import report

pytestmark = pytest.mark.django_db


def scrape(**extra) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of a scrape from loopback."""
    response = Client().get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(response.content.decode())
            for s in family.samples}


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# -- who may read it -----------------------------------------------------------------------


def test_loopback_may_read_it_and_another_address_is_told_nothing_is_there():
    assert Client().get("/metrics").status_code == 200
    outside = Client().get("/metrics", REMOTE_ADDR="203.0.113.9")
    assert outside.status_code == 404
    assert b"bellwether" not in outside.content


@override_settings(BELLWETHER_METRICS_TOKEN="scrape-secret-1234")
@pytest.mark.parametrize("header, expected", [
    (None, 404), ("Bearer wrong", 404), ("Basic scrape-secret-1234", 404),
    ("Bearer scrape-secret-1234", 200), ("bearer  scrape-secret-1234", 200)])
def test_with_a_token_set_only_the_token_opens_it_from_any_address(header, expected):
    extra = {"REMOTE_ADDR": "203.0.113.9"}
    if header is not None:
        extra["HTTP_AUTHORIZATION"] = header
    assert Client().get("/metrics", **extra).status_code == expected


@override_settings(BELLWETHER_PROXY_COUNT=1)
def test_behind_a_proxy_the_address_the_proxy_saw_decides():
    # nginx on loopback forwards a client from outside: that client is not allowed.
    forwarded = Client().get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert forwarded.status_code == 404


def test_only_reading_is_allowed():
    assert Client().post("/metrics").status_code == 404
    assert Client().head("/metrics").status_code == 200


def test_a_bad_network_setting_stops_the_start_naming_the_variable(monkeypatch):
    monkeypatch.setenv("BELLWETHER_METRICS_NETWORKS", "10.0.0.0/8, not-a-network")
    with pytest.raises(ImproperlyConfigured, match="BELLWETHER_METRICS_NETWORKS.*not-a-network"):
        env_networks("BELLWETHER_METRICS_NETWORKS", [])


# -- what it counts ------------------------------------------------------------------------


def test_polls_are_counted_by_outcome_whoever_answers(environment, first, superuser):
    agent = factories.enrolled_agent(environment, actor=superuser)
    before = {o: value("bellwether_agent_polls_total", outcome=o)
              for o in ("changed", "unchanged", "refused")}
    etag = poll(agent.client)["ETag"]  # from the database
    assert poll(agent.client, etag).status_code == 304  # from the cache
    assert poll(factories.bearer_client("bwa_nope.nope"), etag).status_code == 401

    assert {o: value("bellwether_agent_polls_total", outcome=o) - before[o]
            for o in before} == {"changed": 1, "unchanged": 1, "refused": 1}


def test_poll_outcomes_name_what_the_status_means():
    assert [counters.poll_outcome(s) for s in (200, 304, 401, 403, 429, 400, 404, 503, 500)] == [
        "changed", "unchanged", "refused", "refused", "throttled", "bad_request", "other",
        "unavailable", "unavailable"]


def test_accepted_reports_are_counted_by_status_and_a_duplicate_is_not(
        environment, first, superuser):
    agent = factories.enrolled_agent(environment, actor=superuser)
    poll(agent.client)
    before = value("bellwether_agent_reports_total", status="failed")
    assert report(agent.client, first, "failed").status_code == 201
    assert report(agent.client, first, "failed").status_code == 200  # the same report again
    assert report(agent.client, first, "bogus").status_code == 400
    assert value("bellwether_agent_reports_total", status="failed") == before + 1


def test_publications_rollouts_and_wave_progress_come_from_the_database(
        environment, superuser):
    agents = factories.enrolled_agents(environment, 3, actor=superuser)
    first = factories.publish(environment, superuser)
    second = factories.publish_variant(environment, superuser, workers=9)
    factories.start_rollout(environment, second, agents[:1], actor=superuser)

    samples = scrape()
    assert samples[("bellwether_publications", (("outcome", "ready"),))] == 2
    assert samples[("bellwether_publication_duration_seconds_count", ())] == 2
    assert samples[("bellwether_publication_duration_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("bellwether_rollouts", (("state", "running"),))] == 1
    wave = {labels: v for (name, labels), v in samples.items()
            if name == "bellwether_rollout_targets"}
    by_wave_state = {(dict(k)["wave"], dict(k)["state"]): v for k, v in wave.items()}
    assert by_wave_state == {("0", "activated"): 1, ("1", "pending"): 2}
    assert {dict(k)["environment"] for k in wave} == {environment.full_name}
    assert first.number == 1
    assert samples[("bellwether_scrape_source_up", (("source", "database"),))] == 1


def test_a_scrape_costs_the_same_queries_however_many_rollouts_and_agents(
        environment, superuser, django_assert_num_queries):
    # publications by outcome, their durations, rollouts by state, active targets,
    # the scheduler's last run
    agents = factories.enrolled_agents(environment, 2, actor=superuser)
    snapshot = factories.publish(environment, superuser)
    factories.start_rollout(environment, snapshot, agents[:1], actor=superuser)
    with django_assert_num_queries(5):
        scrape()
    factories.enrolled_agents(environment, 20, actor=superuser, prefix="more")
    factories.publish_variant(environment, superuser, workers=7)
    with django_assert_num_queries(5):
        scrape()


def test_a_database_that_fails_leaves_its_part_out_and_says_so(monkeypatch):
    def down():
        raise DatabaseError("connection refused")

    monkeypatch.setattr(endpoint.StoredState, "SOURCES",
                        (("database", down), ("broker", endpoint._queue)))
    samples = scrape()
    assert samples[("bellwether_scrape_source_up", (("source", "database"),))] == 0
    assert not any(name == "bellwether_publications" for name, _ in samples)


@pytest.mark.redis
def test_the_queue_depth_is_the_brokers(settings):
    import redis

    client = redis.Redis.from_url(settings.REDIS_URL)
    queue = settings.CELERY_TASK_DEFAULT_QUEUE
    client.delete(queue)
    client.rpush(queue, "a", "b", "c")
    try:
        samples = scrape()
    finally:
        client.delete(queue)
    assert samples[("bellwether_task_queue_depth", (("queue", queue),))] == 3


# -- request ids ---------------------------------------------------------------------------


def test_every_response_names_its_request_id_and_a_well_formed_one_is_kept():
    kept = Client().get("/healthz", HTTP_X_REQUEST_ID="nginx-abc.123_x")
    assert kept["X-Request-ID"] == "nginx-abc.123_x"
    for hostile in ("a b", "x" * 65, "id\u202e", "<script>"):
        made = Client().get("/healthz", HTTP_X_REQUEST_ID=hostile)
        assert made["X-Request-ID"] != hostile and len(made["X-Request-ID"]) == 32
    assert Client().get("/healthz")["X-Request-ID"] != Client().get("/healthz")["X-Request-ID"]


def test_json_log_lines_carry_the_request_id_of_the_request_that_wrote_them(monkeypatch):
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("%(asctime)s %(levelname)s %(name)s %(message)s "
                                       "%(request_id)s",
                                       rename_fields={"levelname": "level", "name": "logger"}))
    handler.addFilter(requestid.RequestIdFilter())
    logger = logging.getLogger("apps.core.handlers")
    logger.addHandler(handler)
    try:
        monkeypatch.setattr("apps.core.handlers._database_problem", lambda: "down for a test")
        Client().get("/readyz", HTTP_X_REQUEST_ID="req-42")
        logging.getLogger("apps.core.handlers").warning("outside any request")
    finally:
        logger.removeHandler(handler)
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert lines[0]["request_id"] == "req-42" and lines[0]["level"] == "WARNING"
    assert "database" in lines[0]["message"]
    assert lines[1]["request_id"] == "-"
