"""GET /api/v1/agent/desired: the poll answer, its ETag, the cached 304 path, heartbeats."""

import re
import time
import uuid
from datetime import datetime, timedelta

import pytest
from django.core.cache import cache as django_cache
from django.db import connection
from django.test.utils import CaptureQueriesContext, override_settings
from django.utils import timezone

from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, heartbeats, polldebt
from apps.fleet.models import Agent, PollInvalidation
from apps.releases import services as releases
from apps.releases.services import environment_update
from tests.api_helpers import assert_error
from tests.factories import bearer_client, poll, publish_variant
from tests.fleet.support import AGENTS, ENV, agent_url, deploy_url

CACHE_DOWN = {"default": {
    "BACKEND": "django.core.cache.backends.redis.RedisCache",
    "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens here: every cache call fails
}}


def _warm(client) -> str:
    """First poll: computed from the database; caches the agent's ETag."""
    response = poll(client)
    assert response.status_code == 200
    return response["ETag"]


def _agent_status(client, agent):
    return client.get(agent_url(agent.pk)).json()["status"]


# -- the answer ---------------------------------------------------------------------------


def test_desired_without_any_snapshot_is_null(enroll, environment):
    response = poll(enroll().client)

    assert response.status_code == 200
    assert response.json() == {"snapshot": None, "deployment_id": None, "mode": "auto_pull",
                               "poll_interval_s": 30, "drift_policy": "report"}


def test_desired_names_the_active_snapshot_with_a_strong_etag(enroll, first):
    response = poll(enroll().client)

    assert response.status_code == 200
    assert response.json() == {
        "snapshot": {"number": 1, "label": first.label, "checksum": first.checksum,
                     "bundle_url": "/api/v1/agent/snapshots/1/bundle"},
        "deployment_id": None,
        "mode": "auto_pull",
        "poll_interval_s": 30,
        "drift_policy": "report",
    }
    assert re.fullmatch(r'"[^"]+"', response["ETag"]), response["ETag"]
    assert response["Cache-Control"] == "no-cache"


def test_same_desired_state_gives_the_same_etag(enroll, first):
    agent = enroll()

    assert poll(agent.client)["ETag"] == poll(agent.client)["ETag"]


@pytest.mark.parametrize("header", [None, "Bearer", "Token abc", "Bearer bwa_0123456789ab.x",
                                    "Bearer bwu_0123456789ab.user-prefix"])
def test_desired_without_a_valid_agent_token_is_401(header, enroll, first):
    enroll()
    client = bearer_client("x")
    client.credentials(**({"HTTP_AUTHORIZATION": header} if header else {}))

    response = poll(client)

    assert_error(response, 401)


def test_user_token_cannot_poll(api_client, superuser, first):
    response = poll(api_client(superuser))

    assert_error(response, 401)


def test_wrong_secret_for_a_cached_key_is_401(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)
    key = agent.token.partition(".")[0]

    response = poll(bearer_client(f"{key}.not-the-secret"), etag)

    assert_error(response, 401, "authentication_failed")


# -- conditional requests -----------------------------------------------------------------


@pytest.mark.parametrize("form", ["exact", "list", "star", "weak"])
def test_matching_if_none_match_is_304(form, enroll, first):
    agent = enroll()
    etag = _warm(agent.client)
    header = {"exact": etag, "list": f'"nope", {etag}, "other"', "star": "*",
              "weak": f"W/{etag}"}[form]

    response = poll(agent.client, header)

    assert response.status_code == 304
    assert response.content == b""
    assert response["ETag"] == etag


@pytest.mark.parametrize("header", ['"nope"', 'W/"nope"', '"a", "b"'])
def test_other_if_none_match_is_200_with_the_body(header, enroll, first):
    agent = enroll()
    etag = _warm(agent.client)

    response = poll(agent.client, header)

    assert response.status_code == 200
    assert response["ETag"] == etag
    assert response.json()["snapshot"]["number"] == 1


def test_head_behaves_like_get(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)

    matching = poll(agent.client, etag, method="head")
    other = poll(agent.client, '"nope"', method="head")
    unconditional = poll(agent.client, method="head")

    assert matching.status_code == 304
    assert (other.status_code, other["ETag"]) == (200, etag)
    assert (unconditional.status_code, unconditional["ETag"]) == (200, etag)


def test_304_from_a_warm_cache_runs_no_sql(enroll, first, django_assert_num_queries,
                                           monkeypatch):
    # The process's poll debts are read once (by the first 304), and not due again
    # here (tests/fleet/test_poll_debt.py pins the one query per interval).
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=lambda: 0.0))
    agent = enroll()
    client = agent.client
    etag = _warm(client)
    assert poll(client, etag).status_code == 304

    with django_assert_num_queries(0):
        response = poll(client, etag)
        head = poll(client, etag, method="head")

    assert (response.status_code, head.status_code) == (304, 304)


def test_matching_etag_is_304_when_the_cache_entry_is_gone(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)
    django_cache.clear()  # expired, evicted or just invalidated

    response = poll(agent.client, etag)
    star = poll(agent.client, "*")

    assert (response.status_code, star.status_code) == (304, 304)
    assert response.content == b""


def test_304_decided_from_the_database_repeats_the_etag(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)
    django_cache.clear()

    response = poll(agent.client, etag)

    assert response.status_code == 304
    assert response.get("ETag") == etag  # RFC 9110 15.4.5: a 304 carries the ETag


# -- what changes the ETag ---------------------------------------------------------------


def test_new_publish_changes_the_etag_of_auto_pull_agents(
    enroll, first, superuser, environment, django_capture_on_commit_callbacks
):
    agent = enroll()
    etag = _warm(agent.client)

    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)
    response = poll(agent.client, etag)

    assert response.status_code == 200
    assert response["ETag"] != etag
    assert response.json()["snapshot"]["number"] == 2


def test_push_changes_the_etag_and_announces_the_deployment(
    enroll, first, client_for, django_capture_on_commit_callbacks
):
    agent = enroll()
    etag = _warm(agent.client)

    with django_capture_on_commit_callbacks(execute=True):
        pushed = client_for("deployer").post(deploy_url(1), {"agents": [agent.agent.pk]},
                                             format="json")
    response = poll(agent.client, etag)

    assert pushed.status_code == 201
    assert response.status_code == 200
    assert response["ETag"] != etag
    assert response.json()["deployment_id"] == pushed.json()[0]["id"]
    assert response.json()["snapshot"]["number"] == 1


def test_mode_switch_changes_the_etag_and_keeps_the_snapshot(
    enroll, first, client_for, django_capture_on_commit_callbacks
):
    agent = enroll()
    etag = _warm(agent.client)

    with django_capture_on_commit_callbacks(execute=True):
        patched = client_for("deployer").patch(agent_url(agent.agent.pk), {"mode": "manual"},
                                               format="json")
    response = poll(agent.client, etag)

    assert patched.status_code == 200
    assert response.status_code == 200
    assert response["ETag"] != etag
    assert response.json()["mode"] == "manual"
    assert response.json()["snapshot"]["number"] == 1


def test_changes_of_other_agents_keep_the_304(
    enroll, first, client_for, django_capture_on_commit_callbacks
):
    watched, other = enroll("web-1"), enroll("web-2")
    etag = _warm(watched.client)

    with django_capture_on_commit_callbacks(execute=True):
        client_for("deployer").patch(agent_url(other.agent.pk), {"mode": "manual"},
                                     format="json")
    response = poll(watched.client, etag)

    assert response.status_code == 304


def test_label_change_keeps_the_etag_and_generation(enroll, first, client_for,
                                                    django_capture_on_commit_callbacks):
    agent = enroll()
    etag = _warm(agent.client)
    generation = agent.fresh().generation

    with django_capture_on_commit_callbacks(execute=True):
        patched = client_for("deployer").patch(agent_url(agent.agent.pk),
                                               {"labels": {"zone": "b"}}, format="json")

    assert patched.json()["labels"] == {"zone": "b"}
    assert poll(agent.client, etag).status_code == 304
    assert agent.fresh().generation == generation


def test_poll_interval_change_changes_the_etag(enroll, first, environment, superuser,
                                               django_capture_on_commit_callbacks):
    agent = enroll()
    etag = _warm(agent.client)

    with django_capture_on_commit_callbacks(execute=True):
        environment_update(environment=environment, poll_interval_s=60, actor=superuser)
    response = poll(agent.client, etag)

    assert response.status_code == 200
    assert response.json()["poll_interval_s"] == 60


def test_drift_policy_change_changes_the_etag_even_from_a_warm_cache(
        enroll, first, environment, client_for, django_capture_on_commit_callbacks):
    agent = enroll()
    etag = _warm(agent.client)
    assert poll(agent.client, etag).status_code == 304  # answered from the cache

    with django_capture_on_commit_callbacks(execute=True):
        patched = client_for("owner").patch(ENV, {"drift_policy": "restore"}, format="json")
    response = poll(agent.client, etag)

    assert patched.status_code == 200, patched.content
    assert response.status_code == 200
    assert response["ETag"] != etag
    assert response.json()["drift_policy"] == "restore"


def test_drift_policy_change_records_a_poll_invalidation_in_its_transaction(
        enroll, first, environment, superuser):
    agent = enroll()
    before = set(PollInvalidation.objects.values_list("pk", flat=True))

    environment_update(environment=environment, drift_policy="restore", actor=superuser)

    [keys] = PollInvalidation.objects.exclude(pk__in=before).values_list("token_keys",
                                                                         flat=True)
    assert keys == [agent.agent.token_key]


def test_an_unchanged_drift_policy_invalidates_nothing(enroll, first, environment, superuser):
    enroll()
    before = PollInvalidation.objects.count()

    environment_update(environment=environment, drift_policy="report", actor=superuser)

    assert PollInvalidation.objects.count() == before


def test_rotated_token_is_refused_and_the_new_one_polls(
    enroll, first, api_client, superuser, django_capture_on_commit_callbacks
):
    agent = enroll()
    etag = _warm(agent.client)
    body = poll(agent.client).json()

    with django_capture_on_commit_callbacks(execute=True):
        rotated = api_client(superuser).post(agent_url(agent.agent.pk, "/token/rotate"))
    old = poll(agent.client, etag)
    new = poll(bearer_client(rotated.json()["token"]))

    assert rotated.status_code == 200
    assert_error(old, 401, "authentication_failed")
    assert (new.status_code, new.json(), new["ETag"]) == (200, body, etag)


def test_revoked_token_is_refused_on_its_next_poll_even_from_a_warm_cache(
    enroll, first, api_client, superuser, django_capture_on_commit_callbacks
):
    agent = enroll()
    etag = _warm(agent.client)

    with django_capture_on_commit_callbacks(execute=True):
        revoked = api_client(superuser).post(agent_url(agent.agent.pk, "/token/revoke"))
    cached = poll(agent.client, etag)
    plain = poll(agent.client)

    assert revoked.status_code == 200
    assert_error(cached, 401, "authentication_failed")
    assert_error(plain, 401, "authentication_failed")


def test_revoked_token_is_refused_when_nothing_was_cached(enroll, first, superuser):
    agent = enroll()
    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)

    assert_error(poll(agent.client), 401, "authentication_failed")


# -- resolution ---------------------------------------------------------------------------


def test_auto_pull_agent_follows_the_active_snapshot(enroll, first, environment, superuser):
    agent = enroll()
    second = publish_variant(environment, superuser, workers=8)

    body = poll(agent.client).json()

    assert body["snapshot"]["number"] == second.number == 2
    assert body["snapshot"]["checksum"] == second.checksum


def test_manual_agent_stays_on_its_target_until_pushed(enroll, first, environment, superuser,
                                                       client_for):
    agent = enroll(mode="manual")
    publish_variant(environment, superuser, workers=8)

    before = poll(agent.client).json()
    client_for("deployer").post(deploy_url(2), {"agents": [agent.agent.pk]}, format="json")
    after = poll(agent.client).json()

    assert (before["snapshot"]["number"], before["deployment_id"]) == (1, None)
    assert after["snapshot"]["number"] == 2
    assert after["deployment_id"] is not None
    assert agent.fresh().target_snapshot.number == 2


def test_switching_to_manual_keeps_the_current_snapshot(enroll, first, client_for):
    agent = enroll()

    patched = client_for("deployer").patch(agent_url(agent.agent.pk), {"mode": "manual"},
                                           format="json")

    assert patched.status_code == 200
    assert patched.json()["mode"] == "manual"
    assert patched.json()["status"]["desired"] == {"number": 1, "checksum": first.checksum}
    assert poll(agent.client).json()["snapshot"]["number"] == 1
    assert agent.fresh().target_snapshot_id == first.pk


# -- heartbeat ----------------------------------------------------------------------------


def test_poll_records_a_heartbeat_without_writing_the_database(enroll, first, client_for):
    agent = enroll()
    viewer = client_for("viewer")

    with CaptureQueriesContext(connection) as queries:
        assert poll(agent.client).status_code == 200
    status = _agent_status(viewer, agent.agent)

    writes = [q["sql"] for q in queries
              if q["sql"].lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE"))]
    assert writes == []
    assert agent.fresh().last_seen_at is None
    assert status["online"] is True
    seen = datetime.fromisoformat(status["last_seen_at"].replace("Z", "+00:00"))
    assert timezone.now() - seen < timedelta(seconds=30)


def test_304_poll_records_a_heartbeat(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)
    django_cache.set(fleet_cache._seen_key(agent.agent.pk), time.time() - 3600)

    assert poll(agent.client, etag).status_code == 304

    beat = fleet_cache.heartbeats([agent.agent.pk])[agent.agent.pk]
    assert time.time() - beat < 30


def test_heartbeats_flush_copies_last_seen_to_the_database(enroll, first):
    polled, silent = enroll("web-1"), enroll("web-2")
    poll(polled.client)

    flushed = heartbeats.heartbeats_flush()
    again = heartbeats.heartbeats_flush()

    assert (flushed, again) == (1, 0)
    assert silent.fresh().last_seen_at is None
    seen = polled.fresh().last_seen_at
    assert seen is not None and timezone.now() - seen < timedelta(seconds=30)


def test_heartbeats_flush_never_moves_last_seen_back(enroll, first):
    agent = enroll()
    later = timezone.now() + timedelta(hours=1)
    Agent.objects.filter(pk=agent.agent.pk).update(last_seen_at=later)
    poll(agent.client)

    assert heartbeats.heartbeats_flush() == 0
    assert agent.fresh().last_seen_at == later


def test_heartbeats_flush_is_an_update_per_second_the_beats_fall_in(enroll, first):
    """Beats written by held polls come a process at a time: the flush of many
    agents is one UPDATE per second they fall in (at that second's start, never
    later than the agent was seen), however many agents."""
    agents = [enroll(f"web-{i}").agent for i in range(12)]
    now = int(time.time())
    for index, agent in enumerate(agents):
        django_cache.set(fleet_cache._seen_key(agent.pk), now - 60 + (index % 2) + 0.7)

    with CaptureQueriesContext(connection) as captured:
        assert heartbeats.heartbeats_flush() == 12
    updates = [q["sql"] for q in captured.captured_queries if q["sql"].startswith("UPDATE")]
    with CaptureQueriesContext(connection) as again:
        assert heartbeats.heartbeats_flush() == 0

    # The agents, what was copied before, an UPDATE per second; then nothing new.
    assert len(updates) == 2 and len(captured.captured_queries) == 4
    assert len(again.captured_queries) == 2
    assert {a.pk: Agent.objects.get(pk=a.pk).last_seen_at.timestamp() for a in agents} == {
        a.pk: now - 60 + (index % 2) for index, a in enumerate(agents)}


# -- the cache down -----------------------------------------------------------------------


def test_polling_works_from_the_database_when_the_cache_is_down(enroll, first):
    agent = enroll()

    with override_settings(CACHES=CACHE_DOWN):
        response = poll(agent.client)
        other = poll(agent.client, '"nope"')

    assert response.status_code == 200
    assert response.json()["snapshot"]["number"] == 1
    assert (other.status_code, other["ETag"]) == (200, response["ETag"])


def test_revoked_token_is_refused_when_the_cache_is_down(enroll, first, superuser):
    agent = enroll()
    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)

    with override_settings(CACHES=CACHE_DOWN):
        response = poll(agent.client)

    assert_error(response, 401, "authentication_failed")


def test_changes_commit_when_the_cache_is_down(enroll, first, superuser,
                                               django_capture_on_commit_callbacks):
    agent = enroll()

    with override_settings(CACHES=CACHE_DOWN):
        with django_capture_on_commit_callbacks(execute=True):
            deployments = releases.snapshot_deploy(snapshot=first,
                                                   agent_ids=[agent.agent.pk], actor=superuser)
        response = poll(agent.client)

    assert response.json()["deployment_id"] == str(deployments[0].pk)


def test_matching_etag_is_304_when_the_cache_is_down(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)

    with override_settings(CACHES=CACHE_DOWN):
        response = poll(agent.client, etag)
        star = poll(agent.client, "*")

    assert (response.status_code, star.status_code) == (304, 304)


def test_heartbeat_before_the_outage_still_counts(enroll, first, client_for):
    agent = enroll()
    poll(agent.client)
    heartbeats.heartbeats_flush()

    with override_settings(CACHES=CACHE_DOWN):
        status = client_for("viewer").get(AGENTS).json()["results"][0]["status"]

    assert status["online"] is True
    assert status["last_seen_at"] is not None


def test_unknown_agent_token_key_is_not_confused_with_a_cached_one(enroll, first):
    agent = enroll()
    _warm(agent.client)
    secret = agent.token.partition(".")[2]

    response = poll(bearer_client(f"bwa_{uuid.uuid4().hex[:12]}.{secret}"))

    assert_error(response, 401)
    assert poll(agent.client).status_code == 200


# -- long-poll: what the database answers (the wait: tests/fleet/test_cached_poll.py) --


@pytest.mark.parametrize("wait", ["abc", "-1", "1.5", "", "٣", "1e3"])
def test_a_bad_wait_is_400_naming_wait(wait, enroll, first):
    agent = enroll()
    etag = _warm(agent.client)

    response = agent.client.get(f"/api/v1/agent/desired?wait={wait}", HTTP_IF_NONE_MATCH=etag)

    error = assert_error(response, 400)
    assert [d["field"] for d in error["details"]] == ["wait"], error


def test_wait_given_twice_is_400_naming_wait(enroll, first):
    agent = enroll()

    response = agent.client.get("/api/v1/agent/desired?wait=1&wait=2")

    error = assert_error(response, 400)
    assert [d["field"] for d in error["details"]] == ["wait"], error


@override_settings(BELLWETHER_LONG_POLL_MAX_S=45)
@pytest.mark.parametrize("wait", ["0", "30", "9" * 50])
def test_a_wait_without_a_validator_is_answered_at_once_and_advertised(wait, enroll, first):
    agent = enroll()
    _warm(agent.client)

    started = time.monotonic()
    fresh = agent.client.get(f"/api/v1/agent/desired?wait={wait}")

    assert fresh.status_code == 200 and fresh["Bellwether-Long-Poll"] == "45"
    assert time.monotonic() - started < 5


def test_long_polling_off_is_not_advertised(enroll, first, settings):
    settings.BELLWETHER_LONG_POLL_MAX_S = 0
    agent = enroll()

    response = poll(agent.client)

    assert response.status_code == 200 and "Bellwether-Long-Poll" not in response


def test_a_refused_poll_advertises_no_long_poll(first):
    response = bearer_client("bwa_nope.nope").get("/api/v1/agent/desired?wait=5")

    assert_error(response, 401)
    assert "Bellwether-Long-Poll" not in response


# -- the route's refusals, answered from the database with the API's envelope ----------


@pytest.mark.parametrize("method", ["post", "put", "delete", "patch", "options"])
def test_another_method_is_405_naming_the_allowed_ones(enroll, first, method):
    response = getattr(enroll().client, method)("/api/v1/agent/desired")

    assert_error(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET, HEAD"


@pytest.mark.parametrize("query", ["x=1", "wait=1&x=2", "WAIT=1", "wait=%31", "a%00=1"])
def test_a_query_other_than_wait_is_400_naming_the_parameter(enroll, first, query):
    error = assert_error(enroll().client.get(f"/api/v1/agent/desired?{query}"), 400, "invalid")

    assert error["details"][0]["field"] in {"x", "WAIT", "wait", "query"}


def test_a_host_not_allowed_is_400_and_a_precondition_is_evaluated(enroll, first):
    agent = enroll()
    etag = _warm(agent.client)

    refused = agent.client.get("/api/v1/agent/desired", HTTP_HOST="evil.example")
    failed = agent.client.get("/api/v1/agent/desired", HTTP_IF_MATCH='"other"')
    head = poll(agent.client, method="head")

    assert assert_error(refused, 400, "invalid")["details"][0]["field"] == "Host"
    assert failed.status_code == 412
    assert (head.status_code, head.content, head["ETag"]) == (200, b"", etag)


@override_settings(SECURE_SSL_REDIRECT=True)
def test_plain_http_is_redirected_when_https_is_required(enroll, first):
    response = enroll().client.get("/api/v1/agent/desired?wait=5")

    assert response.status_code == 301
    assert response["Location"] == "https://testserver/api/v1/agent/desired?wait=5"


def test_answers_from_the_database_name_their_request_id(enroll, first):
    agent = enroll()

    chosen = agent.client.get("/api/v1/agent/desired", HTTP_X_REQUEST_ID="lb-1234")
    refused = bearer_client("bwa_nope.nope").get("/api/v1/agent/desired",
                                                 HTTP_X_REQUEST_ID="a b")

    assert chosen["X-Request-ID"] == "lb-1234"
    assert re.fullmatch(r"[0-9a-f]{32}", refused["X-Request-ID"])  # not a token: a new one
