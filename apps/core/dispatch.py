"""Queueing Celery work when a transaction commits, without ever failing the change
or holding its request.

The committed rows are the record of the work — a publication still rendering,
a rollout still active — and beat sweeps them (publication_reconcile_task,
rollouts_reconcile_task). So the message is only a prompt: once the transaction
commits it is handed to a sender thread of this process, and the request answers
at once, whatever the broker does. A broker that is down or stalled costs a
delay (until the sweep), never the change: the error is logged, never raised into
a response whose change has already committed. With tasks run inline (embedded
mode, CELERY_TASK_ALWAYS_EAGER) the task runs in the request, as before.

A prompt may be coalesced (`coalesce_s`): every prompt for the same task and
arguments within that window becomes one run that starts after the window, so a
wave of ten thousand reports drives its rollout a few times, not ten thousand.
The task must read what to do from the committed rows; the run starts after
every commit it covers. Without the cache (down, or stalled: the breaker) each
prompt is sent as it comes.
"""

import logging
import queue
import threading

from celery import current_app
from django.core.cache import cache
from django.db import transaction
from kombu.exceptions import OperationalError as BrokerUnavailable

from apps.core.breaker import best_effort_redis

logger = logging.getLogger(__name__)

# Messages waiting for the sender; more than this while the broker is sick are
# dropped (logged): the sweeps queue their work again.
MAX_WAITING = 1000

# A coalesced run starts this long after its window closes.
COALESCE_MARGIN_S = 0.5

_waiting: queue.Queue = queue.Queue(maxsize=MAX_WAITING)
_sender: threading.Thread | None = None
_sender_lock = threading.Lock()


def _first_in_window(task, args: tuple, window_s: int) -> bool:
    """Whether no prompt for `task(*args)` was sent within the last `window_s`."""
    if not best_effort_redis.allows():
        return True
    try:
        return bool(cache.add(f"dispatch:{task.name}:{args!r}", 1, timeout=window_s))
    except Exception as exc:  # noqa: BLE001 - any cache failure: send it, uncoalesced
        best_effort_redis.failed(exc)
        return True


def _send(task, args: tuple, coalesce_s: int | None = None) -> None:
    try:
        if coalesce_s:
            if _first_in_window(task, args, coalesce_s):
                # Starts after the window closes: after every commit it covers.
                task.apply_async(args, countdown=coalesce_s + COALESCE_MARGIN_S)
            return
        task.delay(*args)
    except (BrokerUnavailable, OSError) as exc:
        logger.warning("could not queue %s%r (%s); the periodic sweep will queue it again",
                       task.name, args, exc)


def _send_waiting() -> None:
    while True:
        task, args, coalesce_s = _waiting.get()
        try:
            _send(task, args, coalesce_s)
        except Exception:  # a bug in one message must not stop the sender
            logger.exception("queueing %s%r failed", task.name, args)
        finally:
            _waiting.task_done()


def _hand_to_sender(task, args: tuple, coalesce_s: int | None) -> None:
    global _sender
    with _sender_lock:
        if _sender is None or not _sender.is_alive():
            _sender = threading.Thread(target=_send_waiting, name="bellwether-dispatch",
                                       daemon=True)
            _sender.start()
    try:
        _waiting.put_nowait((task, args, coalesce_s))
    except queue.Full:
        logger.warning("%d messages wait for the broker; %s%r dropped, the periodic sweep "
                       "will queue it again", MAX_WAITING, task.name, args)


def tasks_inline() -> bool:
    """Whether queued tasks run inline in the request that queues them (embedded
    mode, CELERY_TASK_ALWAYS_EAGER; tests)."""
    return bool(current_app.conf.task_always_eager)


def queue_on_commit(task, *args, coalesce_s: int | None = None) -> None:
    """Queue `task(*args)` once the current transaction commits; with `coalesce_s`
    (whole seconds), as one run for all such prompts within that window. Inline
    tasks (embedded mode) are never coalesced: each runs in its request."""

    def send() -> None:
        if task.app.conf.task_always_eager:
            _send(task, args)
        else:
            _hand_to_sender(task, args, coalesce_s)

    # What is queued, for whoever inspects the callbacks.
    send.task, send.args, send.coalesce_s = task, args, coalesce_s
    transaction.on_commit(send)


def wait_until_sent() -> None:
    """Block until every message handed to the sender was sent or given up (tests,
    and a process that wants its prompts out before it exits)."""
    _waiting.join()
