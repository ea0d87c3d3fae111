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
"""

import logging
import queue
import threading

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerUnavailable

logger = logging.getLogger(__name__)

# Messages waiting for the sender; more than this while the broker is sick are
# dropped (logged): the sweeps queue their work again.
MAX_WAITING = 1000

_waiting: queue.Queue = queue.Queue(maxsize=MAX_WAITING)
_sender: threading.Thread | None = None
_sender_lock = threading.Lock()


def _send(task, args: tuple) -> None:
    try:
        task.delay(*args)
    except (BrokerUnavailable, OSError) as exc:
        logger.warning("could not queue %s%r (%s); the periodic sweep will queue it again",
                       task.name, args, exc)


def _send_waiting() -> None:
    while True:
        task, args = _waiting.get()
        try:
            _send(task, args)
        except Exception:  # a bug in one message must not stop the sender
            logger.exception("queueing %s%r failed", task.name, args)
        finally:
            _waiting.task_done()


def _hand_to_sender(task, args: tuple) -> None:
    global _sender
    with _sender_lock:
        if _sender is None or not _sender.is_alive():
            _sender = threading.Thread(target=_send_waiting, name="bellwether-dispatch",
                                       daemon=True)
            _sender.start()
    try:
        _waiting.put_nowait((task, args))
    except queue.Full:
        logger.warning("%d messages wait for the broker; %s%r dropped, the periodic sweep "
                       "will queue it again", MAX_WAITING, task.name, args)


def queue_on_commit(task, *args) -> None:
    """Queue `task(*args)` once the current transaction commits."""

    def send() -> None:
        if task.app.conf.task_always_eager:
            _send(task, args)
        else:
            _hand_to_sender(task, args)

    send.task, send.args = task, args  # what is queued, for whoever inspects the callbacks
    transaction.on_commit(send)


def wait_until_sent() -> None:
    """Block until every message handed to the sender was sent or given up (tests,
    and a process that wants its prompts out before it exits)."""
    _waiting.join()
