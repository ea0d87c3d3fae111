"""What the dashboard's pages show, read through the other apps' selectors and
scoped with Environment.objects.visible_to like every other surface."""

import math
from collections import Counter

from django.db.models import Count

from apps.dashboard import snapshot_reads
from apps.environments.models import Environment
from apps.environments.selectors import environment_role
from apps.fleet.models import DRIFTED, Agent
from apps.fleet.rules import health_text
from apps.fleet.selectors import (
    agent_status,
    agents_with_desired,
    is_online,
    last_seen,
    with_sync,
)
from apps.rollouts.models import ACTIVE_STATES, Rollout
from apps.snapshots.models import Publication, Snapshot, without_content
from apps.snapshots.rules import publication_progress
from apps.snapshots.selectors import pending_events, with_pending_counts
from apps.tenancy.models import ROLE_RANK, Role

AGENTS_SHOWN = 500
SNAPSHOTS_SHOWN = 10  # on the environment's page; the snapshot list has them all
OFFERS_SHOWN = 25  # snapshots the rollout form offers
FLEET_BUCKETS = ("in_sync", "held", "behind", "failed", "offline")


def fleet_bucket(online: bool, sync: str) -> str:
    """One of FLEET_BUCKETS: failed wins (an agent whose last apply failed is still
    failed once it stops polling: going offline fixes nothing), then offline, held
    (following a pin, not the environment) and in sync; the rest is behind."""
    if sync == "failed":
        return "failed"
    if not online:
        return "offline"
    if sync in ("in_sync", "held"):
        return sync
    return "behind"


def _agents(queryset):
    return agents_with_desired(queryset)  # without the joined snapshots' content


def _statuses(agents: list[Agent]) -> list[tuple[Agent, dict]]:
    seen = last_seen(agents)  # one cache read for the whole list
    return [(agent, agent_status(agent, seen.get(agent.pk))) for agent in agents]


def overview_for(user) -> list[dict]:
    """Each environment `user` may see: its active snapshot, its fleet by bucket,
    how many changes wait and its active rollout."""
    environments = list(with_pending_counts(without_content(
        Environment.objects.visible_to(user).select_related("application", "active_snapshot")
        .order_by("application__name", "name"), "active_snapshot")))
    # Counted from a few columns per agent with the sync computed by the database:
    # no snapshot is loaded, whatever the size of the fleet.
    intervals = {environment.pk: environment.poll_interval_s for environment in environments}
    agents = list(with_sync(Agent.objects.in_service().filter(environment__in=environments))
                  .only("pk", "environment_id", "last_seen_at", "drift_seen_at",
                        "drift_restored"))
    seen = last_seen(agents)
    fleets = {environment.pk: Counter() for environment in environments}
    drifted = Counter()  # not a bucket: a drifted agent is also in sync, behind...
    for agent in agents:
        online = is_online(seen.get(agent.pk), intervals[agent.environment_id])
        fleets[agent.environment_id][fleet_bucket(online, agent.sync)] += 1
        if agent.drift_seen_at is not None and not agent.drift_restored:
            drifted[agent.environment_id] += 1
    rollouts = {r.environment_id: r for r in Rollout.objects.filter(
        environment__in=environments, state__in=ACTIVE_STATES).select_related("snapshot")}
    return [{
        "environment": environment,
        "fleet": {bucket: fleets[environment.pk][bucket] for bucket in FLEET_BUCKETS},
        "agents": sum(fleets[environment.pk].values()),
        "drifted": drifted[environment.pk],
        "pending": environment.pending_count,
        "rollout": rollouts.get(environment.pk),
    } for environment in environments]


def environment_for(user, application: str, name: str) -> Environment | None:
    return without_content(
        Environment.objects.visible_to(user).select_related("application__tenant",
                                                            "active_snapshot")
        .filter(application__name=application, name=name), "active_snapshot").first()


def permissions(user, environment: Environment) -> dict:
    """{"can_deploy", "can_own"} from one look at the user's role."""
    role = environment_role(user=user, environment=environment)
    rank = ROLE_RANK[role] if role is not None else -1
    return {"can_deploy": rank >= ROLE_RANK[Role.DEPLOYER],
            "can_own": rank >= ROLE_RANK[Role.OWNER]}


def canary_choices(environment: Environment) -> list[Agent]:
    """The agents a rollout form offers as canaries (the API takes any of them)."""
    return list(Agent.objects.in_service().filter(environment=environment, enabled=True)
                .order_by("name")[:AGENTS_SHOWN])


def canaries_by_percent(environment: Environment, percent: int) -> list[int]:
    """The ids of `percent` of the environment's enabled agents (at least one), the
    first by name: canaries chosen by percent."""
    agents = Agent.objects.in_service().filter(environment=environment, enabled=True)
    count = max(1, math.ceil(agents.count() * percent / 100))
    return list(agents.order_by("name", "pk").values_list("pk", flat=True)[:count])


def rollout_in(environment: Environment, rollout_id: int) -> Rollout | None:
    return (Rollout.objects.filter(pk=rollout_id, environment=environment)
            .select_related("environment", "snapshot").first())


def agents_panel(environment: Environment) -> dict:
    in_service = Agent.objects.in_service().filter(environment=environment)
    agents = list(_agents(in_service).order_by("name")[:AGENTS_SHOWN])
    rows = _statuses(agents)
    counts = in_service.aggregate(total=Count("pk"), drifted=Count("pk", filter=DRIFTED))
    return {"rows": [{"agent": agent, "status": status,
                      "bucket": fleet_bucket(status["online"], status["sync"]),
                      "sync": status["sync"].replace("_", " "),
                      "health": health_text(status["last_health"])}
                     for agent, status in rows],
            "total": counts["total"],
            "drifted": counts["drifted"],
            "shown": len(rows),
            # Pins win (an operator's or a rollout's): a push to all would be refused.
            "any_pinned": in_service.held().exists()}


def snapshots_panel(environment: Environment) -> dict:
    """The newest snapshots (the snapshot list pages through them all) and the
    publications still rendering."""
    rows = snapshot_reads.snapshot_rows(environment)
    return {
        "snapshots": snapshot_reads.mark(environment, list(rows[:SNAPSHOTS_SHOWN])),
        "snapshots_total": Snapshot.objects.filter(environment=environment).count(),
        "rendering": [
            publication_progress(is_rendering=True, created_at=created, claimed_at=claimed)
            for created, claimed in Publication.objects.filter(
                environment=environment, state=Publication.State.RENDERING,
            ).order_by("created_at").values_list("created_at", "claimed_at")[:SNAPSHOTS_SHOWN]],
    }


def _rollout_offers(environment: Environment):
    active = environment.active_snapshot
    snapshots = Snapshot.objects.filter(environment=environment, state="ready").unquarantined()
    if active is not None:
        snapshots = snapshots.filter(number__gt=active.number)
    return snapshots


def rollout_snapshots(environment: Environment) -> list[Snapshot]:
    """What the rollout form offers, newest first: ready snapshots newer than the
    active one and not quarantined (the API refuses the others, with reasons)."""
    return list(without_content(_rollout_offers(environment))
                .order_by("-number")[:OFFERS_SHOWN])


def rollout_offers(environment: Environment, snapshot: Snapshot | None) -> bool:
    """Whether the rollout form offers `snapshot` (ready, newer than the active one,
    not quarantined)."""
    return snapshot is not None and _rollout_offers(environment).filter(pk=snapshot.pk).exists()


def publication_in(environment: Environment, publication_id) -> Publication | None:
    return without_content(Publication.objects.filter(pk=publication_id, environment=environment)
                           .select_related("snapshot"), "snapshot").first()


def pending_panel(environment: Environment) -> dict:
    """The input changes no snapshot holds yet, and what publishing them would
    change against the active snapshot."""
    latest, events = pending_events(environment)
    count = events.count()
    return {"snapshot": latest,
            "events": list(events.select_related("actor").order_by("-id")[:20]),
            "count": count,
            **snapshot_reads.pending_diff(environment)}
