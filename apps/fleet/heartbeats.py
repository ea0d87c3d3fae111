"""Agents' heartbeats: buffered in the cache by the poll path (apps/fleet/cache.py),
copied to agents' last_seen_at in batches."""

import logging
from collections import defaultdict
from datetime import UTC, datetime

from django.db import DatabaseError
from django.db.models import Q

from apps.fleet import cache
from apps.fleet.models import Agent

logger = logging.getLogger(__name__)

BATCH = 1000


def heartbeat_record(agent_id: int) -> None:
    """Record an agent's poll into the cache's buffer; the heartbeats the cache
    refused (only while it fails) straight to the database, so agents do not turn
    offline meanwhile."""
    refused = cache.record_heartbeat(agent_id)
    if refused:
        try:
            heartbeats_save(refused)
        except DatabaseError:
            logger.warning("database unavailable; %d heartbeat(s) kept in this process",
                           len(refused), exc_info=True)


def heartbeats_save(beats: dict[int, float]) -> None:
    """Write heartbeats the cache refused straight to agents' last_seen_at, so
    agents stay online through a cache outage: one UPDATE per thousand agents, at
    the batch's earliest time (never later than an agent was seen), forward only."""
    ids = sorted(beats)
    for start in range(0, len(ids), BATCH):
        batch = ids[start:start + BATCH]
        _seen_forward(batch, min(beats[i] for i in batch))


def heartbeats_flush() -> int:
    """Copy heartbeats from the cache to agents' last_seen_at, a thousand agents at
    a time: one UPDATE per second their new heartbeats fall in, each at the start
    of its second (never later than an agent was seen), forward only; returns how
    many agents it moved forward. A heartbeat already copied costs nothing (an
    agent offline for hours is skipped), and the new ones fall in the seconds
    since the last flush — held polls' in a few, written a process at a time
    (agentapi.longpoll): ten thousand agents are a few dozen UPDATEs, with no
    model built."""
    updated = 0
    ids = list(Agent.objects.order_by("pk").values_list("pk", flat=True))
    for start in range(0, len(ids), BATCH):
        beats = cache.heartbeats(ids[start:start + BATCH])
        copied = dict(Agent.objects.filter(pk__among=beats).values_list("pk", "last_seen_at"))
        by_second = defaultdict(list)
        for pk, beat in beats.items():
            if pk in copied and (copied[pk] is None or copied[pk].timestamp() < int(beat)):
                by_second[int(beat)].append(pk)
        for second, pks in sorted(by_second.items()):
            updated += _seen_forward(pks, second)
    return updated


def _seen_forward(ids: list[int], beat: float) -> int:
    """Agents `ids` seen at `beat` (a Unix time): their last_seen_at moved forward to
    it, never back; how many moved."""
    seen = datetime.fromtimestamp(beat, tz=UTC)
    return (Agent.objects.filter(pk__among=ids)
            .filter(Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=seen))
            .update(last_seen_at=seen))
