"""A change committed while Redis is stalled (SIGSTOP) still reaches its agents
within one poll interval: the change's PollInvalidation, written in its
transaction, makes every process answer those agents from the database until a
sweep has dropped their cache entries for good. Neither the process's memory nor
the order in which a resumed Redis runs the commands queued during the stall
(the change's drop, then a racing poll's stale write-back) matters."""

import time
from datetime import timedelta

import pytest

from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, polldebt, rules, services
from apps.fleet.models import PollInvalidation
from apps.releases import services as releases
from tests.api_helpers import assert_error
from tests.factories import enrolled_agent, poll, publish_variant

STALL_S = 2.3  # the stall seen in production during an activation
# A stale answer outlives its change by at most a refresh of the debts, and the
# request itself (a cache call waits at most the client's 1 s timeout here).
BOUND_S = rules.POLL_DEBT_REFRESH_S + 2.0


@pytest.fixture
def redis_cache(private_redis, settings):
    """The poll cache on the private Redis, with the production client's timeouts."""
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": private_redis.url, "KEY_PREFIX": "bellwether",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}}
    yield private_redis
    fleet_cache._shared = None


def _steady(agent) -> str:
    """The agent's ETag, cached, with no debt left: its polls are 304 from Redis."""
    etag = poll(agent.client)["ETag"]
    PollInvalidation.objects.all().delete()
    time.sleep(rules.POLL_DEBT_REFRESH_S)
    assert poll(agent.client, etag).status_code == 304
    assert fleet_cache.poll_state(agent.agent.token_key)["etag"] == etag
    return etag


def _write_back(agent, etag: str) -> None:
    """What a poll that read the database before the change stores after it: here
    once Redis answers again, after the change's drop (which the stall made fail or
    wait)."""
    fleet_cache.store_poll_state(token_key=agent.agent.token_key,
                                 token_hash=agent.agent.token_hash,
                                 agent_id=agent.agent.pk,
                                 environment_id=agent.agent.environment_id, etag=etag)


def _first_fresh_answer(agent, etag: str, deadline: float):
    while True:
        answer = poll(agent.client, etag)
        if answer.status_code != 304 or time.monotonic() > deadline:
            return answer
        time.sleep(0.1)


def _activate_during_a_stall(redis_cache, environment, superuser, capture, agent, etag, *,
                             write_back: bool):
    with redis_cache.stalled():
        stalled_at = time.monotonic()
        with capture(execute=True):  # the cache drop on commit: it cannot answer
            second = publish_variant(environment, superuser, workers=8)
        time.sleep(max(0.0, STALL_S - (time.monotonic() - stalled_at)))
    resumed_at = time.monotonic()
    if write_back:
        _write_back(agent, etag)
    return second, resumed_at


@pytest.mark.parametrize("write_back", [False, True], ids=["drop", "racing-write-back"])
def test_an_activation_while_redis_stalls_reaches_the_agent_within_the_bound(
        write_back, redis_cache, first, environment, superuser,
        django_capture_on_commit_callbacks):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    etag = _steady(agent)

    second, resumed_at = _activate_during_a_stall(
        redis_cache, environment, superuser, django_capture_on_commit_callbacks, agent,
        etag, write_back=write_back)
    if write_back:  # the stale state is back in Redis
        assert fleet_cache.poll_state(agent.agent.token_key)["etag"] == etag

    answer = _first_fresh_answer(agent, etag, resumed_at + environment.poll_interval_s)
    assert answer.status_code == 200, "the old ETag outlived the change"
    assert answer.json()["snapshot"]["number"] == second.number
    assert time.monotonic() - resumed_at < BOUND_S


def test_a_new_process_answers_the_change_though_redis_kept_the_old_state(
        redis_cache, first, environment, superuser, django_capture_on_commit_callbacks,
        monkeypatch):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    etag = _steady(agent)

    second, resumed_at = _activate_during_a_stall(
        redis_cache, environment, superuser, django_capture_on_commit_callbacks, agent,
        etag, write_back=True)
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts())  # the process died
    assert fleet_cache.poll_state(agent.agent.token_key)["etag"] == etag

    answer = poll(agent.client, etag)
    assert (answer.status_code, answer.json()["snapshot"]["number"]) == (200, second.number)


def test_the_sweep_settles_the_debt_once_redis_answers(
        redis_cache, first, environment, superuser, django_capture_on_commit_callbacks):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    etag = _steady(agent)
    with redis_cache.stalled():
        with django_capture_on_commit_callbacks(execute=True):
            publish_variant(environment, superuser, workers=8)
        services.poll_invalidations_sweep()  # stamps it seen
        PollInvalidation.objects.update(seen_at=PollInvalidation.objects.get().seen_at
                                        - timedelta(seconds=rules.POLL_DEBT_GRACE_S))
        assert services.poll_invalidations_sweep() == 0  # Redis does not answer: kept
    assert PollInvalidation.objects.count() == 1
    _write_back(agent, etag)

    assert services.poll_invalidations_sweep() == 1
    assert fleet_cache.poll_state(agent.agent.token_key) is None
    time.sleep(rules.POLL_DEBT_REFRESH_S)
    fresh = poll(agent.client, etag)
    assert fresh.status_code == 200
    assert poll(agent.client, fresh["ETag"]).status_code == 304


def test_a_revoked_token_is_refused_within_the_bound_while_redis_stalls(
        redis_cache, first, environment, superuser, django_capture_on_commit_callbacks):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    etag = _steady(agent)

    with redis_cache.stalled():
        with django_capture_on_commit_callbacks(execute=True):
            enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)
        committed_at = time.monotonic()
        during = poll(agent.client, etag)
        time.sleep(max(0.0, STALL_S - (time.monotonic() - committed_at)))
    _write_back(agent, etag)
    assert fleet_cache.poll_state(agent.agent.token_key)["etag"] == etag  # written back
    after = poll(agent.client, etag)

    assert_error(during, 401, "authentication_failed")
    assert_error(after, 401, "authentication_failed")


def test_a_decommissioned_agent_is_refused_within_the_bound_while_redis_stalls(
        redis_cache, first, environment, superuser, django_capture_on_commit_callbacks):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    etag = _steady(agent)

    with redis_cache.stalled():
        with django_capture_on_commit_callbacks(execute=True):
            releases.agent_decommission(agent=agent.agent, expected_generation=1,
                                        actor=superuser)
        committed_at = time.monotonic()
        during = poll(agent.client, etag)
        time.sleep(max(0.0, STALL_S - (time.monotonic() - committed_at)))
    _write_back(agent, etag)
    after = poll(agent.client, etag)

    assert "decommissioned" in assert_error(during, 401, "authentication_failed")["message"]
    assert_error(after, 401, "authentication_failed")
