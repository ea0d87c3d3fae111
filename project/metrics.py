"""GET /metrics: Prometheus' text format, for operators' scrapers only.

Who may read it (`metrics_allowed`): with BELLWETHER_METRICS_TOKEN set, a request
presenting it as `Authorization: Bearer <token>`; without one, a client whose
address (throttling.client_ip: the proxy count applies) is in
BELLWETHER_METRICS_NETWORKS (loopback by default). Anyone else gets 404, as if
the endpoint were not there.

What it says: this process's counters (apps/core/metrics.py; summed over
PROMETHEUS_MULTIPROC_DIR's files when set) and, read at each scrape with a fixed
number of queries whatever the size of the fleet, what the database and the
broker know: publications by outcome and their duration, rollouts by state, each
active rollout's targets by wave and state, whether the scheduler is late, and the
task queue's depth. A
database or broker that does not answer leaves those out and says so in
`bellwether_scrape_source_up`, never failing the scrape.
"""

import hmac
import ipaddress
import logging
import os
from datetime import timedelta

from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.http import HttpResponse, HttpResponseNotFound
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector

from apps.core import scheduler
from apps.core.throttling import client_ip
from apps.rollouts.models import ACTIVE_STATES, Rollout, RolloutTarget
from apps.snapshots.models import Publication

logger = logging.getLogger(__name__)

# Seconds from a publish request to its snapshot stored.
PUBLICATION_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 300)


def metrics_allowed(request) -> bool:
    """The scraper's token when one is set, else an address in the allowed networks."""
    token = settings.BELLWETHER_METRICS_TOKEN
    if token:
        scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(
            presented.strip().encode(), token.strip().encode())
    try:
        address = ipaddress.ip_address(client_ip(request))
    except ValueError:
        return False
    return any(address in network for network in settings.BELLWETHER_METRICS_NETWORKS)


def metrics(request):
    if request.method not in ("GET", "HEAD") or not metrics_allowed(request):
        return HttpResponseNotFound("Not found.\n", content_type="text/plain")
    registry = REGISTRY
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)
        registry.register(STORED)
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)


def _publications() -> list:
    outcomes = GaugeMetricFamily("bellwether_publications",
                                 "Publications stored, by outcome", labels=["outcome"])
    for row in Publication.objects.order_by().values("state").annotate(n=Count("pk")):
        outcomes.add_metric([row["state"]], row["n"])
    took = ExpressionWrapper(F("snapshot__created_at") - F("created_at"),
                             output_field=DurationField())
    buckets = {f"le_{i}": Count("pk", filter=Q(took__lte=timedelta(seconds=b)))
               for i, b in enumerate(PUBLICATION_BUCKETS)}
    row = (Publication.objects.order_by().filter(snapshot__isnull=False).annotate(took=took)
           .aggregate(count=Count("pk"), total=Sum("took"), **buckets))
    total = row["total"].total_seconds() if row["total"] else 0.0
    duration = HistogramMetricFamily(
        "bellwether_publication_duration_seconds",
        "From a publish request to its snapshot stored",
        buckets=[*[(str(b), row[f"le_{i}"]) for i, b in enumerate(PUBLICATION_BUCKETS)],
                 ("+Inf", row["count"])], sum_value=total)
    return [outcomes, duration]


def _rollouts() -> list:
    states = GaugeMetricFamily("bellwether_rollouts", "Rollouts, by state", labels=["state"])
    for row in Rollout.objects.order_by().values("state").annotate(n=Count("pk")):
        states.add_metric([row["state"]], row["n"])
    waves = GaugeMetricFamily(
        "bellwether_rollout_targets", "Targets of active rollouts, by wave and state",
        labels=["environment", "rollout", "wave", "current_wave", "state"])
    rows = (RolloutTarget.objects.order_by().filter(rollout__state__in=ACTIVE_STATES)
            .values("rollout_id", "rollout__current_wave", "wave", "state",
                    "rollout__environment__application__name", "rollout__environment__name")
            .annotate(n=Count("pk")))
    for row in rows:
        environment = (f"{row['rollout__environment__application__name']}/"
                       f"{row['rollout__environment__name']}")
        waves.add_metric([environment, str(row["rollout_id"]), str(row["wave"]),
                          str(row["rollout__current_wave"]), row["state"]], row["n"])
    return [states, waves]


def _scheduler() -> list:
    seen = scheduler.last_seen()
    late = GaugeMetricFamily("bellwether_scheduler_late",
                             "1 while the scheduler (celery beat) has not run for two of "
                             "its reconcile intervals")
    late.add_metric([], int(scheduler.is_late(seen)))
    families = [late]
    if seen is not None:
        families.append(GaugeMetricFamily(
            "bellwether_scheduler_last_seen_timestamp_seconds",
            "When the scheduler last sent its periodic work", value=seen.timestamp()))
    return families


def _queue() -> list:
    depth = GaugeMetricFamily("bellwether_task_queue_depth",
                              "Tasks waiting in the broker's queue", labels=["queue"])
    if settings.REDIS_URL:
        from project.celery import app

        queue = settings.CELERY_TASK_DEFAULT_QUEUE
        with app.connection_for_read() as connection:
            depth.add_metric([queue], connection.default_channel.client.llen(queue))
    return [depth]


class StoredState:
    """What the database and the broker know, read at each scrape."""

    SOURCES = (("database", _publications), ("database", _rollouts),
               ("database", _scheduler), ("broker", _queue))

    def describe(self):
        return []  # read at scrapes only, never at registration

    def collect(self):
        up: dict[str, int] = {}
        for source, read in self.SOURCES:
            try:
                yield from read()
                up.setdefault(source, 1)
            except Exception as exc:  # noqa: BLE001 - a down source never fails the scrape
                logger.warning("metrics: %s unavailable: %s", source, exc)
                up[source] = 0
        gauge = GaugeMetricFamily("bellwether_scrape_source_up",
                                  "Whether a source answered this scrape", labels=["source"])
        for source, value in sorted(up.items()):
            gauge.add_metric([source], value)
        yield gauge


STORED = StoredState()
REGISTRY.register(STORED)
