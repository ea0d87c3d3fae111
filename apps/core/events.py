"""Live events: ids only, sent to channel groups after the change commits.

A page that receives one refetches what it shows; it never trusts data in the event.
Kinds: agent {id} (no id: many agents of the environment), deployment {id, agent,
snapshot}, snapshot {number}, rollout {id}, pending {}. Every event names its
environment. A user's own group carries session.end (logout) to their sockets.

Domain events (`announce`) are the other kind: named facts about an environment
(DOMAIN_EVENTS) handed to the subscribers an app above registered (`subscribe`;
apps.webhooks records its deliveries there). They run inside the announcing
transaction, so what they write commits or rolls back with the change.
"""

import asyncio
import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from apps.core.breaker import best_effort_redis

logger = logging.getLogger(__name__)

KINDS = ("agent", "deployment", "snapshot", "rollout", "pending")

# Named facts an environment's owners may subscribe to (webhooks). The approval
# events are announced by apps.governance: "approval.requested" {approval, snapshot,
# requested_by} and "approval.given" {approval, snapshot, given_by}.
DOMAIN_EVENTS = (
    "snapshot.published",     # {snapshot, label, checksum, kind, state}
    "rollout.started",        # {rollout, snapshot, waves, strategy}
    "rollout.wave_advanced",  # {rollout, snapshot, wave, waves, why}
    "rollout.confirmed",      # {rollout, snapshot, wave}
    "rollout.completed",      # {rollout, snapshot}
    "rollout.rolled_back",    # {rollout, snapshot, rollback_snapshot, reason}
    "approval.requested",
    "approval.given",
    "drift.reported",         # {agent, name, snapshot, files, restored, drifted}
)

_subscribers: list = []


def environment_group(environment_id: int) -> str:
    return f"environment.{environment_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


# The event loop serving this process's websockets (and agents' reports recorded in
# batches, agentapi.reports), once one connected. Sends go through it: the in-memory
# layer of embedded mode only wakes consumers from their own loop, and a thread of
# its own (the embedded periodic loop) has no other way there; for any other thread
# it saves a loop of its own per send. Celery workers and processes without sockets
# use a loop of their own.
_serving_loop: asyncio.AbstractEventLoop | None = None


def serving_loop_is(loop: asyncio.AbstractEventLoop) -> None:
    global _serving_loop
    _serving_loop = loop


def _logged(group: str):
    def done(future) -> None:
        if not future.cancelled() and future.exception() is not None:
            logger.warning("live event to %s not sent: %r", group, future.exception())
            best_effort_redis.failed(future.exception())
    return done


def _send(group: str, message: dict) -> None:
    if not best_effort_redis.allows():
        logger.warning("live event to %s not sent: the channel layer failed a moment ago",
                       group)
        return
    loop = _serving_loop
    try:
        layer = get_channel_layer()
        if layer is None:
            return
        if loop is not None and loop.is_running():
            asyncio.run_coroutine_threadsafe(layer.group_send(group, message),
                                             loop).add_done_callback(_logged(group))
        else:
            async_to_sync(layer.group_send)(group, message)
    except Exception as exc:  # a lost live event must never fail the change that caused it
        logger.warning("live event to %s not sent", group, exc_info=True)
        best_effort_redis.failed(exc)


def emit(kind: str, *, environment_id: int, **ids) -> None:
    """Send `kind` to the environment's group once the current transaction commits
    (at once outside one)."""
    if kind not in KINDS:
        raise ValueError(f"unknown live event kind {kind!r}")
    event = {"kind": kind, "environment": environment_id, **ids}
    transaction.on_commit(lambda: _send(environment_group(environment_id),
                                        {"type": "live.event", "event": event}))


def emit_session_end(*, user_id: int, session_key: str | None) -> None:
    """Close the user's sockets opened with `session_key` (all of them for None)."""
    transaction.on_commit(lambda: _send(user_group(user_id), {
        "type": "session.end", "session_key": session_key}))


def subscribe(handler) -> None:
    """Call `handler(name, environment_id=..., data=...)` for every domain event,
    inside the announcing transaction (an app's ready() registers it once)."""
    if handler not in _subscribers:
        _subscribers.append(handler)


def announce(name: str, /, *, environment_id: int, **data) -> None:
    """Hand the domain event `name` about an environment to every subscriber, in the
    caller's transaction; `data` holds ids and numbers only (JSON)."""
    if name not in DOMAIN_EVENTS:
        raise ValueError(f"unknown domain event {name!r}")
    for handler in _subscribers:
        handler(name, environment_id=environment_id, data=data)
