"""agentapi's Redis reads and writes (apps.fleet.cache._AsyncRedis), on a real Redis:
what one event-loop turn asks for shares one round trip, whatever the number of
requests at once — after a publish every agent's bundle and report count their API
rate at the same moment, more requests than redis-py's pool has connections."""

import asyncio
import socket
from types import SimpleNamespace

import pytest
from django.core.cache import cache as django_cache
from django.core.cache.backends.redis import RedisCache

from agentapi import cached
from apps.core.breaker import best_effort_redis
from apps.core.throttling import AgentRateThrottle
from apps.fleet import cache as fleet_cache

pytestmark = pytest.mark.redis

MORE_THAN_A_POOL = 300  # redis-py's asyncio pool opens at most 100 connections


@pytest.fixture
def three_a_minute(settings):
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "agent": "3/minute"}


@pytest.fixture
def agent_rate(three_a_minute, empty_cache):
    pass


class Counted:
    """The batched client's real Redis client, its MGETs and pipelines counted, and
    the most MGETs in flight at once."""

    def __init__(self, monkeypatch):
        self.mgets = self.pipelines = self.in_flight = self.most_in_flight = 0
        connect = fleet_cache._AsyncRedis.connect

        def connected(backend):
            redis = connect(backend)
            mget, pipeline = redis.mget, redis.pipeline

            async def counted_mget(*args, **kwargs):
                self.mgets += 1
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
                try:
                    return await mget(*args, **kwargs)
                finally:
                    self.in_flight -= 1

            def counted_pipeline(*args, **kwargs):
                self.pipelines += 1
                return pipeline(*args, **kwargs)

            redis.mget, redis.pipeline = counted_mget, counted_pipeline
            return redis

        monkeypatch.setattr(fleet_cache._AsyncRedis, "connect", staticmethod(connected))


def history(agent_id: int) -> list:
    """The agent's counted requests, as DRF's throttle reads them."""
    caller = SimpleNamespace(user=SimpleNamespace(agent=SimpleNamespace(pk=agent_id)))
    return django_cache.get(AgentRateThrottle().get_cache_key(caller, None)) or []


def test_the_rates_of_more_agents_than_a_pool_has_connections_are_all_counted(
        agent_rate, monkeypatch):
    counted = Counted(monkeypatch)

    async def storm():
        return await asyncio.gather(*(cached.within_rate(agent_id)
                                      for agent_id in range(1, MORE_THAN_A_POOL + 1)))

    allowed = asyncio.run(storm())

    assert allowed == [True] * MORE_THAN_A_POOL
    assert best_effort_redis.allows()  # no failure: the throttle was not switched off
    assert [len(history(agent_id)) for agent_id in (1, 150, MORE_THAN_A_POOL)] == [1, 1, 1]
    assert (counted.mgets, counted.pipelines) == (1, 1)  # one read, one write for all


def test_an_agent_over_its_rate_is_refused_across_round_trips(agent_rate):
    async def one_after_another():
        return [await cached.within_rate(7) for _ in range(4)]

    assert asyncio.run(one_after_another()) == [True, True, True, False]
    assert len(history(7)) == 3


def test_one_agents_requests_sent_at_once_are_each_counted(agent_rate):
    """Twenty requests of one agent at once (a token used to flood the routes): each
    counted, so three pass, not all of them on one shared read of the count."""
    async def at_once():
        return await asyncio.gather(*(cached.within_rate(9) for _ in range(20)))

    allowed = asyncio.run(at_once())

    assert allowed.count(True) == 3
    assert len(history(9)) == 3
    assert not cached._counting


def test_poll_states_read_at_once_share_one_round_trip(empty_cache, monkeypatch):
    fleet_cache.store_poll_states({f"key{i:013d}": {"agent_id": i, "etag": f'"{i}"'}
                                   for i in range(MORE_THAN_A_POOL)})
    counted = Counted(monkeypatch)

    async def reads():
        return await asyncio.gather(*(fleet_cache.poll_state_async(f"key{i:013d}")
                                      for i in range(-5, MORE_THAN_A_POOL)))

    states = asyncio.run(reads())

    assert states[:5] == [None] * 5  # never stored
    assert [s["agent_id"] for s in states[5:]] == list(range(MORE_THAN_A_POOL))
    assert counted.mgets == 1


def test_reads_asked_while_one_is_in_flight_wait_for_it_and_go_together(
        empty_cache, monkeypatch):
    """One round trip in flight, never one per loop turn: arrivals spread over
    many turns (as a storm's) hold one connection, not one each."""
    fleet_cache.store_poll_states({f"key{i:013d}": {"agent_id": i} for i in range(200)})
    counted = Counted(monkeypatch)

    async def one_per_turn():
        reads = []
        for i in range(200):
            reads.append(asyncio.ensure_future(fleet_cache.poll_state_async(f"key{i:013d}")))
            await asyncio.sleep(0)
        return await asyncio.gather(*reads)

    states = asyncio.run(one_per_turn())

    assert [s["agent_id"] for s in states] == list(range(200))
    assert counted.most_in_flight == 1
    assert counted.mgets < 200


def test_a_redis_down_lets_requests_through_and_is_logged_once_per_round_trip(
        three_a_minute, settings, monkeypatch, caplog):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    down = RedisCache(f"redis://127.0.0.1:{port}/0", settings.CACHES["default"])
    monkeypatch.setattr(fleet_cache, "_cache", lambda: down)

    async def storm():
        states = await asyncio.gather(*(fleet_cache.poll_state_async(f"key{i:013d}")
                                        for i in range(50)))
        allowed = await asyncio.gather(*(cached.within_rate(i) for i in range(50)))
        return states, allowed

    states, allowed = asyncio.run(storm())

    assert states == [None] * 50  # the database answers them
    assert allowed == [True] * 50  # a cache down refuses no request
    assert not best_effort_redis.allows()  # the throttle skips Redis for a moment
    failures = [r.getMessage() for r in caplog.records if "read(s) failed" in r.getMessage()]
    assert failures == ["cache unavailable; 50 read(s) failed"] * 2
