"""Production backends are wired to the real services when their URLs are set."""

import uuid

import channels_redis.core
import pytest
from channels.layers import get_channel_layer
from django.conf import settings
from django.core.cache import cache
from django.db import connection


@pytest.mark.postgres
@pytest.mark.django_db
def test_database_url_selects_postgresql_with_a_connection_pool():
    assert connection.vendor == "postgresql"
    assert "pool" in settings.DATABASES["default"].get("OPTIONS", {})
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)


@pytest.mark.redis
def test_redis_url_backs_the_cache():
    assert settings.CACHES["default"]["BACKEND"].endswith("RedisCache")
    key = f"test-{uuid.uuid4()}"
    cache.set(key, {"n": 1}, timeout=30)
    try:
        assert cache.get(key) == {"n": 1}
    finally:
        cache.delete(key)


@pytest.mark.redis
async def test_redis_url_backs_the_channel_layer():
    layer = get_channel_layer()
    assert isinstance(layer, channels_redis.core.RedisChannelLayer), type(layer)
    channel = await layer.new_channel()
    group = f"test-{uuid.uuid4().hex}"
    await layer.group_add(group, channel)
    await layer.group_send(group, {"type": "snapshot.event", "number": 7})
    assert await layer.receive(channel) == {"type": "snapshot.event", "number": 7}
    await layer.group_discard(group, channel)


def test_healthz_answers_without_touching_the_database(db, client, django_assert_num_queries):
    with django_assert_num_queries(0):
        response = client.get("/healthz")
    assert (response.status_code, response.content) == (200, b"ok\n")
