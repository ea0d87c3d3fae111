"""The live consumer at /ws/live/: authenticates the session (the origin is checked by
the router), joins the groups of the environments the user may see — through the
same Environment.objects.visible_to as every other surface — and forwards events.

Before forwarding an event or answering the page's ping (every 25 s), once
BELLWETHER_LIVE_RECHECK_S passed since the last check, the session and the
subscriptions are checked again: a user who signed out elsewhere, whose session
expired or changed, who was deactivated or who lost access to an environment stops
receiving its events, and one who gained access starts. Signing out through Django
ends this session's sockets at once (apps.dashboard.receivers).
"""

import asyncio
import contextlib
import json
import logging
import time
from importlib import import_module

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.contrib.auth import (
    BACKEND_SESSION_KEY,
    HASH_SESSION_KEY,
    SESSION_KEY,
    get_user_model,
)
from django.utils.crypto import constant_time_compare
from redis.exceptions import RedisError

from apps.core import metrics
from apps.core.events import environment_group, serving_loop_is, user_group
from apps.environments.models import Environment

logger = logging.getLogger(__name__)

# Close codes the page understands. SIGNED_OUT (this session signed out): it stops.
# SESSION_CHANGED (the check failed): it reconnects, and the handshake decides with
# whatever session its cookie holds now.
SIGNED_OUT = 4401
SESSION_CHANGED = 4403
# Channel layers drop a group member a day (group_expiry) after it joined: join again
# well before that.
GROUP_REFRESH_S = 3600


@database_sync_to_async
def visible_environment_ids(user, wanted: list[int]) -> list[int]:
    environments = Environment.objects.visible_to(user)
    if wanted:
        environments = environments.filter(pk__in=wanted)
    return list(environments.order_by("pk").values_list("pk", flat=True)
                [:settings.BELLWETHER_LIVE_MAX_ENVIRONMENTS])


@database_sync_to_async
def signed_in_user(session_key: str | None, user_id: int):
    """The user if the session still exists, still belongs to this active user, and
    their password (the session hash, fallback keys included) has not changed."""
    if not session_key:
        return None
    store = import_module(settings.SESSION_ENGINE).SessionStore(session_key)
    data = store.load()
    if (str(data.get(SESSION_KEY)) != str(user_id)
            or data.get(BACKEND_SESSION_KEY) not in settings.AUTHENTICATION_BACKENDS):
        return None
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        return None
    session_hash = data.get(HASH_SESSION_KEY, "")
    hashes = [user.get_session_auth_hash(), *user.get_session_auth_fallback_hash()]
    return user if any(constant_time_compare(session_hash, h) for h in hashes) else None


def _wanted(query_string: bytes) -> list[int]:
    """?environment=1&environment=2 narrows the subscription (ids, ignored if junk)."""
    ids = []
    for pair in query_string.decode("latin-1").split("&"):
        key, _, value = pair.partition("=")
        if key == "environment" and value.isascii() and value.isdigit():
            ids.append(int(value))
    return ids


class LiveConsumer(AsyncJsonWebsocketConsumer):
    async def __call__(self, scope, receive, send):
        """Serve the socket; when the channel layer (Redis) fails, end it with a
        close (a refused handshake before it was accepted) instead of an error,
        and the page falls back to polling."""
        try:
            await super().__call__(scope, receive, send)
        except (RedisError, OSError):
            logger.warning("channel layer unavailable; live socket ended", exc_info=True)
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": 1011})

    async def connect(self):
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close()  # before accept: the handshake is refused (403)
            return
        serving_loop_is(asyncio.get_running_loop())
        self.user_id = user.pk
        self.session_key = self.scope["session"].session_key
        self.wanted = _wanted(self.scope.get("query_string", b""))
        self.environment_ids: set[int] = set()
        try:
            await self._subscribe(user, refresh=True)
        except (RedisError, OSError):
            # The channel layer (Redis) is down: refuse the handshake cleanly; the
            # page keeps polling and tries again later.
            logger.warning("channel layer unavailable; live socket refused", exc_info=True)
            del self.environment_ids  # nothing to leave on disconnect
            await self.close()
            return
        await self.accept()
        metrics.WEBSOCKETS.inc()
        self.counted = True
        await self.send_json({"kind": "hello", "environments": sorted(self.environment_ids)})

    async def _subscribe(self, user, *, refresh: bool) -> None:
        """Be in exactly the groups of the environments `user` may see now; with
        `refresh`, join every group again (and the user's own)."""
        visible = set(await visible_environment_ids(user, self.wanted))
        for gone in self.environment_ids - visible:
            await self.channel_layer.group_discard(environment_group(gone), self.channel_name)
        joining = visible if refresh else visible - self.environment_ids
        if refresh:
            await self.channel_layer.group_add(user_group(self.user_id), self.channel_name)
            self.refreshed_at = time.monotonic()
        for environment_id in joining:
            await self.channel_layer.group_add(environment_group(environment_id),
                                               self.channel_name)
        self.environment_ids = visible
        self.checked_at = time.monotonic()

    async def _still_allowed(self) -> bool:
        """Check the session and the subscriptions again once due; closes the socket
        and answers False when the session no longer holds."""
        now = time.monotonic()
        if now - self.checked_at < settings.BELLWETHER_LIVE_RECHECK_S:
            return True
        user = await signed_in_user(self.session_key, self.user_id)
        if user is None:
            await self.close(code=SESSION_CHANGED)
            return False
        await self._subscribe(user, refresh=now - self.refreshed_at >= GROUP_REFRESH_S)
        return True

    async def disconnect(self, code):
        if getattr(self, "counted", False):
            metrics.WEBSOCKETS.dec()
            self.counted = False
        if not hasattr(self, "environment_ids"):
            return
        await self.channel_layer.group_discard(user_group(self.user_id), self.channel_name)
        for environment_id in self.environment_ids:
            await self.channel_layer.group_discard(environment_group(environment_id),
                                                   self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        """The page sends only pings: they keep the checks going while no events come,
        and the pong tells the page the socket is alive. Anything else is ignored."""
        try:
            content = json.loads(text_data) if text_data else None
        except (ValueError, RecursionError):
            return
        if isinstance(content, dict) and content.get("kind") == "ping" and (
                not getattr(self, "closing", False) and await self._still_allowed()):
            await self.send_json({"kind": "pong"})

    async def close(self, code=None, reason=None):
        self.closing = True
        await super().close(code=code, reason=reason)

    async def live_event(self, message):
        if getattr(self, "closing", False) or not await self._still_allowed():
            return
        if message["event"].get("environment") in self.environment_ids:
            await self.send_json(message["event"])

    async def session_end(self, message):
        if message.get("session_key") in (None, self.session_key):
            await self.close(code=SIGNED_OUT)
