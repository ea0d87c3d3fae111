"""Reads about agents: desired state resolution, the poll answer, status."""

import hashlib
import json
from datetime import UTC, datetime, timedelta

from django.db.models import Case, F, Value, When
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from apps.fleet import cache, rules
from apps.fleet.models import HELD, Agent, Deployment, PollInvalidation
from apps.snapshots.models import Snapshot, without_content

OFFLINE_AFTER_POLL_INTERVALS = 3


def desired_snapshot_for(agent: Agent) -> Snapshot | None:
    """Its pin if any, else the manual target, else the environment's active
    snapshot (rules.desired_source)."""
    source = rules.desired_source(agent)
    if source == rules.PINNED:
        return agent.pinned_snapshot  # a rollout may hold a target at "nothing yet"
    if source == rules.TARGET:
        return agent.target_snapshot
    return agent.environment.active_snapshot


def announced_deployment_for(agent: Agent, snapshot: Snapshot | None) -> Deployment | None:
    """The pending push of `snapshot` the agent should apply as a push."""
    if snapshot is None:
        return None
    return (
        Deployment.objects.filter(agent=agent, kind=Deployment.Kind.PUSH,
                                  state=Deployment.State.PENDING, snapshot=snapshot)
        .order_by("-created_at")
        .only("id")
        .first()
    )


def bundle_url(snapshot: Snapshot) -> str:
    return bundle_url_of(snapshot.number)


def bundle_url_of(number: int) -> str:
    return f"/api/v1/agent/snapshots/{number}/bundle"


def desired_state_for(agent: Agent) -> tuple[dict, str]:
    """The body of GET /api/v1/agent/desired and its strong ETag."""
    snapshot = desired_snapshot_for(agent)
    return desired_answer(agent, snapshot, announced_deployment_for(agent, snapshot))


def desired_answer(agent: Agent, snapshot: Snapshot | None,
                   deployment: Deployment | None) -> tuple[dict, str]:
    """The desired body (and its ETag) of `agent` desiring `snapshot`, announced as
    `deployment` (or not)."""
    return desired_answer_of(
        snapshot=None if snapshot is None else (snapshot.number, snapshot.label,
                                                snapshot.checksum),
        deployment_id=getattr(deployment, "pk", None), mode=agent.mode,
        poll_interval_s=agent.environment.poll_interval_s,
        drift_policy=agent.environment.drift_policy)


def desired_answer_of(*, snapshot: tuple[int, str, str] | None, deployment_id, mode: str,
                      poll_interval_s: int, drift_policy: str) -> tuple[dict, str]:
    """The desired body and its ETag from what it names: the snapshot (number,
    label, checksum) or None, the announcing push's id or None, the agent's mode and
    its environment's poll interval and drift policy."""
    body = {
        "snapshot": None if snapshot is None else {
            "number": snapshot[0],
            "label": snapshot[1],
            "checksum": snapshot[2],
            "bundle_url": bundle_url_of(snapshot[0]),
        },
        "deployment_id": str(deployment_id) if deployment_id is not None else None,
        "mode": mode,
        "poll_interval_s": poll_interval_s,
        "drift_policy": drift_policy,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    return body, f'"{digest[:40]}"'


def desired_body_bytes(body: dict) -> bytes:
    """The desired body as the API renders it to an agent (DRF's JSON renderer), kept
    with the cached answer so agentapi can send it."""
    return JSONRenderer().render(body)


DESIRED_SNAPSHOTS = ("environment__active_snapshot", "target_snapshot", "pinned_snapshot")

# What an agent's desired answer reads, as columns (the refill after a publish reads
# them for every agent of the environment: no model is built): the agent's own,
# its environment's, and each snapshot it may desire (by rules.desired_source).
_SOURCES = {rules.PINNED: "pinned_snapshot", rules.TARGET: "target_snapshot",
            rules.ACTIVE: "environment__active_snapshot"}
_SNAPSHOT_READ = ("id", "number", "label", "checksum")
ANSWER_READ = (
    "pk", "token_key", "token_hash", "generation", "mode", "pinned_snapshot_id",
    "pin_rollout_id", "environment_id", "environment__poll_interval_s",
    "environment__drift_policy",
    *(f"{relation}__{column}" for relation in _SOURCES.values() for column in _SNAPSHOT_READ))


def _desired_of(row) -> tuple[int, str, str, int] | None:
    """(number, label, checksum, id) of the snapshot an ANSWER_READ row desires."""
    relation = _SOURCES[rules.desired_source(row)]
    number, label, checksum, pk = (getattr(row, f"{relation}__{column}")
                                   for column in ("number", "label", "checksum", "id"))
    return None if pk is None else (number, label, checksum, pk)


def desired_states_of(token_keys) -> list[tuple[tuple, dict, str]]:
    """(agent, body, ETag) of the agents holding these token keys whose tokens are
    accepted (in service, not revoked), as desired_state_for answers each — the
    agent as a row of ANSWER_READ's columns (no model is built: a refill reads ten
    thousand): two queries however many agents (their rows with what they desire,
    their pending pushes); each distinct answer computed once (after a publish,
    most agents of an environment get the same)."""
    agents = list(Agent.objects.filter(
        token_key__among=token_keys, decommissioned_at__isnull=True,
        token_revoked_at__isnull=True).order_by("pk").values_list(*ANSWER_READ, named=True))
    pushes: dict[tuple[int, int], object] = {}
    for agent_id, snapshot_id, pk in (Deployment.objects
                                      .filter(agent_id__among=[a.pk for a in agents],
                                              kind=Deployment.Kind.PUSH,
                                              state=Deployment.State.PENDING)
                                      .order_by("-created_at")
                                      .values_list("agent_id", "snapshot_id", "id")):
        pushes.setdefault((agent_id, snapshot_id), pk)
    answers, computed = [], {}
    for agent in agents:
        snapshot = _desired_of(agent)
        deployment_id = None if snapshot is None else pushes.get((agent.pk, snapshot[3]))
        inputs = (agent.environment_id, agent.mode, snapshot, deployment_id)
        if inputs not in computed:
            computed[inputs] = desired_answer_of(
                snapshot=snapshot and snapshot[:3], deployment_id=deployment_id,
                mode=agent.mode, poll_interval_s=agent.environment__poll_interval_s,
                drift_policy=agent.environment__drift_policy)
        answers.append((agent, *computed[inputs]))
    return answers


def poll_states_of(token_keys) -> dict[str, dict]:
    """Token key -> the cached poll state of its agent's current answer, for the
    accepted tokens among `token_keys` (desired_states_of: two queries)."""
    rendered: dict[str, bytes] = {}  # ETag -> body bytes: each distinct answer rendered once
    states = {}
    for agent, body, etag in desired_states_of(token_keys):
        if etag not in rendered:
            rendered[etag] = desired_body_bytes(body)
        states[agent.token_key] = cache.poll_state_of(
            token_hash=agent.token_hash, agent_id=agent.pk, environment_id=agent.environment_id,
            etag=etag, generation=agent.generation, body=rendered[etag])
    return states


def poll_state_current(agent_id: int, *, token_key: str, etag: str) -> bool:
    """Whether `etag` is still the agent's answer and its token still valid."""
    fresh = agents_with_desired(Agent.objects.filter(pk=agent_id)).first()
    return (fresh is not None and fresh.token_key == token_key
            and fresh.token_revoked_at is None and desired_state_for(fresh)[1] == etag)


def poll_debts() -> tuple[rules.IndebtedKeys, list]:
    """The token keys whose cached poll answers are not to be trusted (those of the
    poll invalidations not yet settled; but for an answer computed at the generation
    a key's changes reached, rules.IndebtedKeys), and those invalidations' seen_at.
    One query."""
    rows = list(PollInvalidation.objects.values_list("token_keys", "generations", "seen_at"))
    required = rules.debt_generations((keys, generations) for keys, generations, _ in rows)
    return rules.IndebtedKeys(required), [seen_at for _, _, seen_at in rows]


def agents_with_desired(queryset):
    """`queryset` with what an agent's desired state reads joined: the snapshots it
    may desire without their content (one row per agent carries each), its
    environment without its config text and schema."""
    return without_content(queryset.select_related(
        "environment__application", *DESIRED_SNAPSHOTS, "pinned_by",
    ), *DESIRED_SNAPSHOTS).defer("environment__config", "environment__config_schema")


def last_seen(agents) -> dict[int, datetime | None]:
    """agent id -> last poll time: the cache's heartbeat, else the flushed column."""
    return last_seen_of({agent.pk: agent.last_seen_at for agent in agents})


def last_seen_of(flushed: dict[int, datetime | None]) -> dict[int, datetime | None]:
    """last_seen of agents given as {id: their flushed last_seen_at column}."""
    seen = last_seen_seconds_of({pk: column and column.timestamp()
                                 for pk, column in flushed.items()})
    return {pk: None if at is None else datetime.fromtimestamp(at, tz=UTC)
            for pk, at in seen.items()}


def last_seen_seconds_of(flushed: dict[int, float | None]) -> dict[int, float | None]:
    """When agents were last seen, in seconds since the epoch, given as {id: their
    flushed last_seen_at column, in seconds}: the later of it and the heartbeat
    the cache holds (to the microsecond, as the column)."""
    beats = {pk: round(beat, 6) for pk, beat in cache.heartbeats(flushed).items()}
    return {pk: max((t for t in (beats.get(pk), column) if t), default=None)
            for pk, column in flushed.items()}


def is_online(seen_at: datetime | None, poll_interval_s: int) -> bool:
    """Seen within the last OFFLINE_AFTER_POLL_INTERVALS poll intervals."""
    return seen_at is not None and timezone.now() - seen_at <= (
        OFFLINE_AFTER_POLL_INTERVALS * timedelta(seconds=poll_interval_s))


def _desired(field: str):
    """The desired snapshot's `field`, resolved in SQL like desired_snapshot_for."""
    return Case(When(HELD, then=F(f"pinned_snapshot__{field}")),
                When(mode=Agent.Mode.MANUAL, then=F(f"target_snapshot__{field}")),
                default=F(f"environment__active_snapshot__{field}"))


def desired_snapshot_id():
    """Each agent's desired snapshot id as a query expression: desired_snapshot_for's
    rule computed by the database, for writing many agents' rows in one statement."""
    return _desired("id")


def with_sync(queryset):
    """Agents annotated with `sync`, agent_status's rule computed by the database:
    for counting many agents without loading their snapshots."""
    return queryset.annotate(
        desired_number=_desired("number"), desired_checksum=_desired("checksum"),
    ).annotate(sync=Case(
        When(HELD, then=Value("held")),
        When(applied_number__isnull=True, then=Value("never_applied")),
        When(applied_number=F("desired_number"), applied_checksum=F("desired_checksum"),
             then=Value("in_sync")),
        When(last_status="failed", then=Value("failed")),
        default=Value("behind"),
    ))


def agent_status(agent: Agent, seen_at: datetime | None) -> dict:
    """What operators see of an agent."""
    desired = desired_snapshot_for(agent)
    online = is_online(seen_at, agent.environment.poll_interval_s)
    if agent.is_held:
        sync = "held"  # it follows its pin, not the environment
    elif agent.applied_number is None:
        sync = "never_applied"
    elif desired is not None and (agent.applied_number, agent.applied_checksum) == (
        desired.number, desired.checksum
    ):
        sync = "in_sync"
    elif agent.last_status == "failed":
        sync = "failed"
    else:
        sync = "behind"
    return {
        "last_seen_at": seen_at,
        "online": online,
        "desired": None if desired is None else {"number": desired.number,
                                                 "checksum": desired.checksum},
        "applied": None if agent.applied_number is None else {
            "number": agent.applied_number, "checksum": agent.applied_checksum},
        "sync": sync,
        "last_status": agent.last_status or None,
        "last_message": agent.last_message,
        "last_report_at": agent.last_report_at,
        "last_health": agent.last_health,
        "blocked": None if agent.blocked_number is None else {
            "number": agent.blocked_number, "checksum": agent.blocked_checksum},
        "pinned": None if agent.pinned_snapshot_id is None else {
            "number": agent.pinned_snapshot.number, "at": agent.pinned_at},
        "held_by": rules.held_by(agent),
        "drift": agent_drift(agent),
    }


def agent_drift(agent: Agent) -> dict | None:
    """The agent's hand-edited files as it last reported them, or None."""
    if agent.drift_seen_at is None:
        return None
    return {"files": agent.drift, "seen_at": agent.drift_seen_at,
            "restored": agent.drift_restored}


def agents_outside(environment_id: int, **fields) -> dict[str, list[int]]:
    """Of the agent ids each field names, those that are no agents of the
    environment (another environment's, or none): {field: ids}, in one query."""
    named = {int(pk) for ids in fields.values() for pk in ids or ()}
    inside = set(Agent.objects.filter(environment_id=environment_id, pk__in=named)
                 .values_list("pk", flat=True)) if named else set()
    return {field: sorted(set(ids or ()) - inside) for field, ids in fields.items()}


def refuse_agents_outside(environment, **fields) -> None:
    """400 unknown_agents when a field names agents outside `environment`
    (rules.strangers_refusal): nothing is looked up further, nothing written."""
    refusal = rules.strangers_refusal(environment.full_name,
                                      agents_outside(environment.pk, **fields))
    if refusal is not None:
        raise refusal


def agent_ids_named(environment, **fields) -> dict[str, list[int] | None]:
    """Each field's agents (ids or names: AgentReferenceField) as ids: a name is the
    agent in service of `environment` so named (one query for all); 400
    unknown_agents (rules.strangers_refusal) naming the names no agent has. Ids are
    checked where they are used (refuse_agents_outside)."""
    names = {ref for refs in fields.values() for ref in refs or () if isinstance(ref, str)}
    found = dict(Agent.objects.filter(environment=environment, decommissioned_at__isnull=True,
                                      name__in=names).values_list("name", "pk")) if names else {}
    refusal = rules.strangers_refusal(environment.full_name, {
        field: [ref for ref in refs or () if isinstance(ref, str) and ref not in found]
        for field, refs in fields.items()})
    if refusal is not None:
        raise refusal
    return {field: None if refs is None else [found.get(ref, ref) for ref in refs]
            for field, refs in fields.items()}
