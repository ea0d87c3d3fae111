"""Queueing Celery work when a transaction commits, without ever failing the change.

The committed rows are the record of the work — a publication still rendering,
a rollout still active — and beat sweeps them (publication_reconcile_task,
rollouts_reconcile_task). So a broker that is down costs a delay, never the
change: the error is logged, never raised into a response whose change has
already committed.
"""

import logging

from django.db import transaction
from kombu.exceptions import OperationalError as BrokerUnavailable

logger = logging.getLogger(__name__)


def queue_on_commit(task, *args) -> None:
    """Queue `task(*args)` once the current transaction commits."""

    def send() -> None:
        try:
            task.delay(*args)
        except (BrokerUnavailable, OSError) as exc:
            logger.warning("could not queue %s%r (%s); the periodic sweep will queue it again",
                           task.name, args, exc)

    send.task, send.args = task, args  # what is queued, for whoever inspects the callbacks
    transaction.on_commit(send)
