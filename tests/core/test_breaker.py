"""A best-effort Redis call that failed is skipped for a moment, not retried on
every request of a stall (each retry would cost REDIS_TIMEOUT_S)."""

from types import SimpleNamespace
from unittest import mock

from apps.core import events
from apps.core.breaker import Breaker, best_effort_redis
from apps.core.throttling import UserRateThrottle


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_failure_is_remembered_for_the_pause_then_the_dependency_is_tried_again():
    clock = Clock()
    breaker = Breaker("redis", pause_s=5, clock=clock)
    assert breaker.allows()
    breaker.failed(TimeoutError("stalled"))
    assert not breaker.allows()
    clock.now += 4.9
    assert not breaker.allows()
    clock.now += 0.2
    assert breaker.allows()


def test_after_a_throttle_met_a_failing_cache_the_next_requests_do_not_wait_on_it(rf, settings):
    settings.BELLWETHER_THROTTLE_RATES = {**settings.BELLWETHER_THROTTLE_RATES,
                                          "user": "100/minute"}
    cache = mock.Mock(get=mock.Mock(side_effect=TimeoutError("stalled")))
    request = rf.get("/")
    request.user = SimpleNamespace(is_authenticated=True, pk=1)
    with mock.patch.object(UserRateThrottle, "cache", cache):
        assert UserRateThrottle().allow_request(request, None)
        assert UserRateThrottle().allow_request(request, None)
        assert UserRateThrottle().allow_request(request, None)
    assert cache.get.call_count == 1
    assert not best_effort_redis.allows()


def test_after_a_live_event_failed_the_next_ones_are_dropped_at_once():
    layer = mock.Mock(group_send=mock.AsyncMock(side_effect=TimeoutError("stalled")))
    with mock.patch.object(events, "get_channel_layer", return_value=layer):
        events._send("environment.1", {"type": "live.event"})
        events._send("environment.1", {"type": "live.event"})
    assert layer.group_send.await_count == 1
    best_effort_redis.reset()
    with mock.patch.object(events, "get_channel_layer", return_value=layer):
        events._send("environment.1", {"type": "live.event"})
    assert layer.group_send.await_count == 2
