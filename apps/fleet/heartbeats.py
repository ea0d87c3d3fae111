"""Agents' heartbeats: buffered in the cache by the poll path (apps/fleet/cache.py),
copied to agents' last_seen_at in batches."""

from datetime import UTC, datetime

from django.db.models import Q

from apps.fleet import cache
from apps.fleet.models import Agent


def heartbeats_save(beats: dict[int, float]) -> None:
    """Write heartbeats the cache refused straight to agents' last_seen_at, so
    agents stay online through a cache outage: one UPDATE per thousand agents, at
    the batch's earliest time (never later than an agent was seen), forward only."""
    ids = sorted(beats)
    for start in range(0, len(ids), 1000):
        batch = ids[start:start + 1000]
        seen = datetime.fromtimestamp(min(beats[i] for i in batch), tz=UTC)
        (Agent.objects.filter(pk__in=batch)
         .filter(Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=seen))
         .update(last_seen_at=seen))


def heartbeats_flush() -> int:
    """Copy heartbeats from the cache to agents' last_seen_at, in batches."""
    updated = 0
    ids = list(Agent.objects.values_list("pk", flat=True))
    for start in range(0, len(ids), 1000):
        batch = ids[start:start + 1000]
        beats = cache.heartbeats(batch)
        agents = []
        for agent in Agent.objects.filter(pk__in=beats).only("pk", "last_seen_at"):
            seen = datetime.fromtimestamp(beats[agent.pk], tz=UTC)
            if agent.last_seen_at is None or seen > agent.last_seen_at:
                agent.last_seen_at = seen
                agents.append(agent)
        Agent.objects.bulk_update(agents, ["last_seen_at"], batch_size=500)
        updated += len(agents)
    return updated
