"""The live consumer at /ws/live/: authenticates the session (the origin is checked by
the router), joins the groups of the environments the user may see — through the
same Environment.objects.visible_to as every other surface — and forwards events.

The session is checked again before forwarding once it is older than
BELLWETHER_LIVE_RECHECK_S, so a user who signed out elsewhere, whose session
expired or who was deactivated stops receiving events; signing out through Django
ends this session's sockets at once (apps.dashboard.receivers).
"""

import asyncio
import time
from importlib import import_module

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY, SESSION_KEY, get_user_model
from django.utils.crypto import constant_time_compare

from apps.core.events import environment_group, serving_loop_is, user_group
from apps.environments.models import Environment

# Close codes the page understands: it stops reconnecting on SIGNED_OUT.
SIGNED_OUT = 4401


@database_sync_to_async
def visible_environment_ids(user, wanted: list[int]) -> list[int]:
    environments = Environment.objects.visible_to(user)
    if wanted:
        environments = environments.filter(pk__in=wanted)
    return list(environments.order_by("pk").values_list("pk", flat=True)
                [:settings.BELLWETHER_LIVE_MAX_ENVIRONMENTS])


@database_sync_to_async
def still_signed_in(session_key: str | None, user_id: int) -> bool:
    """The session still exists, still belongs to this active user, and the user's
    password (the session hash) has not changed since."""
    if not session_key:
        return False
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()
    if str(data.get(SESSION_KEY)) != str(user_id):
        return False
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    return user is not None and constant_time_compare(
        data.get(HASH_SESSION_KEY, ""), user.get_session_auth_hash())


def _wanted(query_string: bytes) -> list[int]:
    """?environment=1&environment=2 narrows the subscription (ids, ignored if junk)."""
    ids = []
    for pair in query_string.decode("latin-1").split("&"):
        key, _, value = pair.partition("=")
        if key == "environment" and value.isdigit():
            ids.append(int(value))
    return ids


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close()  # before accept: the handshake is refused (403)
            return
        serving_loop_is(asyncio.get_running_loop())
        self.user_id = user.pk
        self.session_key = self.scope["session"].session_key
        self.checked_at = time.monotonic()
        ids = await visible_environment_ids(user, _wanted(self.scope.get("query_string", b"")))
        self.groups_joined = [user_group(user.pk), *(environment_group(i) for i in ids)]
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_json({"kind": "hello", "environments": ids})

    async def disconnect(self, code):
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)

    async def receive_json(self, content, **kwargs):
        """The page sends nothing but pings; answer so it can tell the socket is alive."""
        if isinstance(content, dict) and content.get("kind") == "ping":
            await self.send_json({"kind": "pong"})

    async def close(self, code=None, reason=None):
        self.closing = True
        await super().close(code=code, reason=reason)

    async def live_event(self, message):
        if getattr(self, "closing", False):
            return
        if time.monotonic() - self.checked_at >= settings.BELLWETHER_LIVE_RECHECK_S:
            if not await still_signed_in(self.session_key, self.user_id):
                await self.close(code=SIGNED_OUT)
                return
            self.checked_at = time.monotonic()
        await self.send_json(message["event"])

    async def session_end(self, message):
        if message.get("session_key") in (None, self.session_key):
            await self.close(code=SIGNED_OUT)
