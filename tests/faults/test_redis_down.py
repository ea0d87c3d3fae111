"""Redis down (a private Redis, stopped): agents' heartbeats reach the database, so
healthy agents stay online; the live socket's handshake is refused cleanly."""

import time
from datetime import timedelta

import pytest
import redis
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.utils import timezone

from apps.fleet import cache as fleet_cache
from apps.fleet import selectors
from tests import factories
from tests.factories import enrolled_agent, poll


def redis_settings(settings, url: str) -> None:
    """The cache and the channel layer on `url`, with the production clients' timeouts."""
    settings.CACHES = {"default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": url, "KEY_PREFIX": "bellwether",
        "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1}}}
    settings.CHANNEL_LAYERS = {"default": {
        "BACKEND": "apps.core.channel_layer.RedisChannelLayer",
        "CONFIG": {"hosts": [{"address": url, "socket_timeout": 2,
                              "socket_connect_timeout": 2}], "blocking_pop_s": 1}}}


@pytest.fixture
def redis_down(private_redis, settings):
    redis_settings(settings, private_redis.url)
    private_redis.terminate()
    yield
    fleet_cache._shared = None


def test_heartbeats_reach_the_database_while_redis_is_down(redis_down, first, environment,
                                                         superuser, monkeypatch):
    agent = enrolled_agent(environment, "web-1", actor=superuser)
    long_ago = timezone.now() - timedelta(hours=1)
    agent.agent.__class__.objects.filter(pk=agent.agent.pk).update(last_seen_at=long_ago)
    monkeypatch.setattr(fleet_cache._HeartbeatBuffer, "FLUSH_S", 0.0)

    assert poll(agent.client).status_code == 200  # answered from the database

    fresh = agent.fresh()
    assert fresh.last_seen_at > timezone.now() - timedelta(seconds=5)
    seen = selectors.last_seen([fresh])[fresh.pk]
    assert selectors.is_online(seen, environment.poll_interval_s)
    # Kept for the cache too: written there once Redis answers again.
    assert agent.agent.pk in fleet_cache._heartbeats.pending()


@pytest.mark.django_db(transaction=True)
async def test_the_live_handshake_is_refused_cleanly_while_the_channel_layer_is_down(
        redis_down):
    from channels.db import database_sync_to_async

    from project.asgi import application

    @database_sync_to_async
    def signed_in():
        client = factories.session_client(factories.superuser())
        return client.cookies[settings.SESSION_COOKIE_NAME].value

    session_key = await signed_in()
    communicator = WebsocketCommunicator(application, "/ws/live/", headers=[
        (b"host", b"testserver"), (b"origin", b"http://testserver"),
        (b"cookie", f"{settings.SESSION_COOKIE_NAME}={session_key}".encode())])
    started = time.monotonic()
    connected, code = await communicator.connect(timeout=10)
    await communicator.disconnect()
    assert not connected  # refused (403), not an error
    assert time.monotonic() - started < 5


def test_agents_polling_through_a_redis_outage_longer_than_the_offline_threshold_stay_online(
        private_redis, settings, first, environment, superuser):
    """Redis down for longer than an agent takes to turn offline, then back EMPTY
    (it keeps nothing on disk): agents that kept polling are online throughout and
    after, in the agents' status as the API and dashboard compute it."""
    redis_settings(settings, private_redis.url)
    environment.__class__.objects.filter(pk=environment.pk).update(poll_interval_s=5)
    environment.refresh_from_db()
    threshold_s = selectors.OFFLINE_AFTER_POLL_INTERVALS * environment.poll_interval_s
    assert threshold_s == 15
    agents = [enrolled_agent(environment, f"web-{i}", actor=superuser) for i in (1, 2)]
    etags = {a.pk: poll(a.client)["ETag"] for a in agents}

    def poll_all() -> None:
        for agent in agents:
            started = time.monotonic()
            response = poll(agent.client, etags[agent.pk])
            assert response.status_code == 304, response.content
            assert time.monotonic() - started < 2.5

    def online() -> dict:
        fresh = [a.fresh() for a in agents]
        seen = selectors.last_seen(fresh)
        return {a.name: selectors.agent_status(a, seen[a.pk])["online"] for a in fresh}

    try:
        private_redis.terminate()
        down_since = time.monotonic()
        while time.monotonic() - down_since < threshold_s + 3:
            poll_all()
            assert all(online().values()), online()
            time.sleep(1)

        private_redis.start()
        assert redis.Redis(port=private_redis.port).dbsize() == 0  # back, empty
        fleet_cache._shared = None
        assert all(online().values()), online()  # from what reached the database
        poll_all()
        from apps.fleet.heartbeats import heartbeats_flush
        heartbeats_flush()  # beat's flush with the empty cache takes nothing back
        assert all(online().values()), online()
    finally:
        fleet_cache._shared = None


def test_readyz_names_redis_while_it_is_down_and_healthz_stays_up(redis_down, db, client,
                                                                   settings):
    settings.REDIS_URL = "redis://configured"  # readyz checks Redis only when one is set
    started = time.monotonic()
    ready = client.get("/readyz")

    assert ready.status_code == 503
    assert [d["dependency"] for d in ready.json()["error"]["details"]] == ["redis"]
    assert time.monotonic() - started < 3
    assert client.get("/healthz").status_code == 200
