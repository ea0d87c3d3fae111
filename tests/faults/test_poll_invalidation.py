"""A change committed while Redis is stalled still reaches its agents within one
poll interval: the poll states it could not drop are dropped by a retry as soon as
Redis answers again, instead of serving the old ETag for POLL_STATE_TTL."""

import time

import pytest

from apps.fleet import cache as fleet_cache
from tests.factories import enrolled_agent, poll, publish_variant

STALL_S = 2.3  # the stall seen in production during an activation


@pytest.fixture
def redis_cache(private_redis, settings):
    """The poll cache on the private Redis, with the production client's timeouts."""
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": private_redis.url, "KEY_PREFIX": "bellwether",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}}
    yield private_redis
    fleet_cache._shared = None


def test_an_activation_while_redis_stalls_reaches_the_agent_within_a_poll_interval(
        redis_cache, first, environment, superuser, django_capture_on_commit_callbacks):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    cached = poll(agent.client)
    assert poll(agent.client, cached["ETag"]).status_code == 304  # answered from Redis

    with redis_cache.stalled():
        stalled_at = time.monotonic()
        with django_capture_on_commit_callbacks(execute=True):
            second = publish_variant(environment, superuser, workers=8)
        committed_at = time.monotonic()
        assert fleet_cache._invalidations.pending()  # the drop failed: Redis is stalled
        time.sleep(max(0.0, STALL_S - (committed_at - stalled_at)))

    environment.refresh_from_db()
    assert environment.active_snapshot_id == second.pk
    deadline = committed_at + environment.poll_interval_s
    while True:
        answer = poll(agent.client, cached["ETag"])
        if answer.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert answer.status_code == 200, "the old ETag outlived the change by a poll interval"
    assert answer.json()["snapshot"]["number"] == second.number
    assert time.monotonic() - committed_at < STALL_S + 3
    assert not fleet_cache._invalidations.pending()
