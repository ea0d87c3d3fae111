"""Failed authentications are counted in Redis (a private one here): counted while it
answers; uncounted, and not waited on more than once, while it stalls or is down."""

import time

import pytest
from django.test import override_settings

from tests.factories import bearer_client
from tests.faults.test_redis_down import redis_settings

pytestmark = pytest.mark.django_db

ENVIRONMENTS = "/api/v1/environments"
ATTACKER = "203.0.113.66"
BOUND = {"user": None, "agent": None, "anon": None, "failed_auth": "3/minute"}


def _bad_requests(count: int) -> list[int]:
    client = bearer_client("bwu_0123456789ab.not-the-secret")
    with override_settings(BELLWETHER_THROTTLE_RATES=BOUND):
        return [client.get(ENVIRONMENTS, REMOTE_ADDR=ATTACKER).status_code
                for _ in range(count)]


def test_failures_are_counted_in_redis_while_it_answers(private_redis, settings):
    redis_settings(settings, private_redis.url)
    assert _bad_requests(5) == [401, 401, 401, 429, 429]


def test_a_stalled_redis_counts_nothing_and_costs_one_timeout(private_redis, settings):
    redis_settings(settings, private_redis.url)  # socket timeouts of 1 s
    _bad_requests(1)  # connections open
    with private_redis.stalled():
        start = time.monotonic()
        answers = _bad_requests(8)
        elapsed = time.monotonic() - start

    assert set(answers) == {401}
    assert elapsed < 1 + 1.5, elapsed  # one timeout; the breaker skips the rest


def test_a_stopped_redis_counts_nothing(private_redis, settings):
    redis_settings(settings, private_redis.url)
    private_redis.terminate()
    assert set(_bad_requests(8)) == {401}
