"""Live events (apps.core.events) on the configured channel layer: sent to the
environment's group only once the change commits, never for a rolled-back change,
and a layer that fails never fails the change that caused the event.

A test channel joins the group and reads the layer directly; database work runs
through database_sync_to_async (another thread), hence transaction=True.
"""

import asyncio
import logging

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.db import transaction

from apps.core import events
from apps.core.events import emit, emit_session_end, environment_group, user_group
from apps.environments.models import Environment
from apps.releases.services import environment_update

QUIET_S = 0.5


class Boom(Exception):
    pass


@pytest.fixture
async def listen():
    """await listen(group) -> a new channel of the configured layer, in `group`."""
    layer = get_channel_layer()
    joined = []

    async def join(group: str) -> str:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
        joined.append((group, channel))
        return channel

    yield join
    for group, channel in joined:
        await layer.group_discard(group, channel)


async def receive(channel: str, timeout: float = 2) -> dict:
    return await asyncio.wait_for(get_channel_layer().receive(channel), timeout)


async def nothing_arrives(channel: str, timeout: float = QUIET_S) -> bool:
    try:
        message = await receive(channel, timeout)
    except TimeoutError:
        return True
    raise AssertionError(f"unexpected message {message}")


def _bumped(environment: Environment) -> str:
    return environment.config.replace("workers: 4", "workers: 5")


def test_emit_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown live event kind 'config'"):
        emit("config", environment_id=1)


@pytest.mark.django_db(transaction=True)
async def test_change_rolled_back_sends_no_event(listen, environment, superuser):
    channel = await listen(environment_group(environment.pk))
    before = environment.config

    def change_then_fail():
        with transaction.atomic():
            environment_update(environment=environment, config=_bumped(environment),
                               actor=superuser)
            raise Boom

    with pytest.raises(Boom):
        await database_sync_to_async(change_then_fail)()

    assert await nothing_arrives(channel)
    stored = await database_sync_to_async(Environment.objects.get)(pk=environment.pk)
    assert stored.config == before


@pytest.mark.slow  # watches a second for the event that must not come yet
@pytest.mark.django_db(transaction=True)
async def test_event_is_sent_once_the_change_commits_not_before(
    listen, environment, superuser
):
    channel = await listen(environment_group(environment.pk))
    quiet_before_commit = []

    def change():
        with transaction.atomic():
            environment_update(environment=environment, config=_bumped(environment),
                               actor=superuser)
            quiet_before_commit.append(async_to_sync(nothing_arrives)(channel))

    await database_sync_to_async(change)()

    assert quiet_before_commit == [True]
    assert await receive(channel) == {
        "type": "live.event", "event": {"kind": "pending", "environment": environment.pk}}
    assert await nothing_arrives(channel)


@pytest.mark.django_db(transaction=True)
async def test_emit_outside_a_transaction_sends_at_once(listen):
    channel = await listen(environment_group(7))

    await database_sync_to_async(emit)("agent", environment_id=7, id=3)

    assert await receive(channel) == {
        "type": "live.event", "event": {"kind": "agent", "environment": 7, "id": 3}}


@pytest.mark.django_db(transaction=True)
async def test_event_goes_only_to_its_environments_group(listen):
    mine = await listen(environment_group(7))
    other = await listen(environment_group(8))

    await database_sync_to_async(emit)("pending", environment_id=7)

    assert (await receive(mine))["event"] == {"kind": "pending", "environment": 7}
    assert await nothing_arrives(other)


@pytest.mark.django_db(transaction=True)
async def test_session_end_goes_to_the_users_group_with_the_session_key(listen):
    channel = await listen(user_group(5))

    await database_sync_to_async(emit_session_end)(user_id=5, session_key="abc")

    assert await receive(channel) == {"type": "session.end", "session_key": "abc"}


@pytest.mark.django_db(transaction=True)
def test_failing_channel_layer_does_not_fail_the_change(
    environment, superuser, monkeypatch, caplog
):
    class DownLayer:
        async def group_send(self, group, message):
            raise ConnectionError("channel layer is down")

    monkeypatch.setattr(events, "get_channel_layer", DownLayer)
    config = _bumped(environment)

    with caplog.at_level(logging.WARNING, logger="apps.core.events"):
        updated = environment_update(environment=environment, config=config, actor=superuser)

    assert updated.config == config
    assert Environment.objects.get(pk=environment.pk).config == config
    assert f"live event to environment.{environment.pk} not sent" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_without_a_channel_layer_changes_go_through(environment, superuser, monkeypatch):
    monkeypatch.setattr(events, "get_channel_layer", lambda: None)
    config = _bumped(environment)

    environment_update(environment=environment, config=config, actor=superuser)

    assert Environment.objects.get(pk=environment.pk).config == config
