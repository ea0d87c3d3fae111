"""Webhook sequence numbers under concurrent announcements, on PostgreSQL with real
row locks: events announced at once by several transactions get distinct,
gap-free sequence numbers per endpoint, in the order the transactions commit."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction

from apps.core.events import announce
from apps.webhooks import services
from apps.webhooks.models import WebhookDelivery

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

THREADS = 6
TIMEOUT_S = 60


def test_concurrent_announcements_take_distinct_sequences_in_commit_order(
        environment, superuser, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": True}
    endpoint, _ = services.endpoint_create(environment=environment,
                                           url="http://127.0.0.1:9/hook",
                                           events=["rollout.started"], actor=superuser)
    barrier = threading.Barrier(THREADS)
    committed: list[int] = []
    lock = threading.Lock()

    def announce_one(n: int) -> None:
        try:
            barrier.wait(timeout=TIMEOUT_S)
            with transaction.atomic():
                announce("rollout.started", environment_id=environment.pk, rollout=n)
                with lock:  # the order of commits, as the row lock serialises them
                    committed.append(n)
        finally:
            connection.close()

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(announce_one, range(THREADS)))

    rows = list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("sequence")
                .values_list("sequence", "body"))
    assert [sequence for sequence, _ in rows] == list(range(1, THREADS + 1))
    assert [f'"rollout":{n}' in body for n, (_, body) in zip(committed, rows, strict=True)] == [
        True] * THREADS
    endpoint.refresh_from_db()
    assert endpoint.next_sequence == THREADS + 1
