"""State changes of the fleet: modes and labels, activation, pushes, pins, reports
(enrollment and tokens are apps.fleet.enrollment, reports apps.fleet.reports).

Every change of an agent's desired state bumps its generation and records, in its
transaction, the agents whose cached poll answers it makes stale (a
PollInvalidation): their polls are answered from the database until a sweep has
dropped those cache entries for good; on commit the entries are dropped at once
when the cache answers (activations, pushes and pins write the new answers instead:
their debts trust answers of the generations they reached).
"""

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Case, F, Value, When
from django.db.models.lookups import IsNull
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, ValidationFailed
from apps.core.events import emit
from apps.environments.models import Environment
from apps.fleet import announcements, cache, refill, rules
from apps.fleet.models import Agent, Deployment, PollInvalidation
from apps.snapshots.guard import content_activated
from apps.snapshots.models import Snapshot

logger = logging.getLogger(__name__)

def forget_polls_on_commit(agents_or_keys) -> None:
    """These agents' cached poll answers are stale once the transaction commits:
    record it in the transaction (a PollInvalidation, the debt a sweep settles),
    and drop the cache entries on commit, then wake their long-polls."""
    keys = sorted({a.token_key if isinstance(a, Agent) else a for a in agents_or_keys})
    if keys:
        PollInvalidation.objects.create(token_keys=keys)
        transaction.on_commit(lambda: _forget_and_announce(keys))


def _forget_and_announce(keys) -> None:
    # A cache that failed the drop would make the announcement wait its timeout
    # too: the sweep announces once the cache answers again.
    if cache.forget_poll_states(keys):
        announcements.announce(keys)


def refresh_polls_on_commit(agents) -> None:
    """These agents' poll answers changed with their generations (`agents`: a query
    read after the bump): record the debt with the generation each reached, and
    after commit refill their answers in the cache (apps.fleet.refill: off the
    committing request, rather than send every agent to the database)."""
    generations = dict(agents.order_by().values_list("token_key", "generation"))
    if keys := sorted(generations):
        PollInvalidation.objects.create(token_keys=keys, generations=generations)
        transaction.on_commit(lambda: refill.refill_after_commit(keys))


SWEEP_BATCH = 500


def poll_invalidations_sweep() -> int:
    """Settle the poll invalidations past their grace period: drop their keys from
    the cache (those computed before the generation a refilled change reached, for
    such a change), then delete their rows; returns how many were settled. Rows not seen
    before are stamped now (their grace starts). When the cache fails nothing is
    deleted: the agents stay answered from the database until a later sweep."""
    now = timezone.now()
    PollInvalidation.objects.filter(seen_at__isnull=True).update(seen_at=now)
    due = list(PollInvalidation.objects
               .filter(seen_at__lte=now - timedelta(seconds=rules.POLL_DEBT_GRACE_S))
               .values_list("pk", "token_keys", "generations")[:SWEEP_BATCH])
    if not due:
        return 0
    required = rules.debt_generations((keys, generations) for _, keys, generations in due)
    if not cache.forget_poll_states_before(required):
        return 0
    announcements.announce(sorted(required))  # a long-poll the commit's announcement missed
    PollInvalidation.objects.filter(pk__in=[pk for pk, _, _ in due]).delete()
    return len(due)


def agent_changed_on_commit(agent: Agent, *, token_key: str | None = None) -> None:
    """The agent's poll answer changed: its cached poll state (kept under
    `token_key`, its key before a rotation) is no longer trusted, and live pages
    are told, on commit."""
    forget_polls_on_commit([token_key or agent.token_key])
    emit("agent", environment_id=agent.environment_id, id=agent.pk)


def environment_polls_changed(environment: Environment) -> None:
    """The poll answer of every agent of `environment` changed (e.g. its interval):
    their cached ETags are no longer trusted once the transaction commits."""
    forget_polls_on_commit(Agent.objects.in_service().filter(environment=environment)
                           .values_list("token_key", flat=True))


def check_labels(labels) -> dict:
    problem = rules.labels_problem(labels)
    if problem:
        raise ValidationFailed(problem, details=[
            {"field": rules.labels_field(labels), "message": problem}])
    return labels


def _bump(agent_ids) -> None:
    Agent.objects.filter(pk__among=agent_ids).update(generation=F("generation") + 1)


# --- desired state -----------------------------------------------------------------


def pushes_supersede(agent_ids, *, keep_snapshot: Snapshot | None = None,
                     keep_pinned: bool = False) -> int:
    """Close pending pushes of these agents, except those of `keep_snapshot` (or,
    with `keep_pinned`, of the snapshot each agent is pinned to; an agent pinned
    on nothing keeps its pushes): a newer desired state means an older announced
    push will never apply."""
    pending = Deployment.objects.filter(agent_id__among=agent_ids, kind=Deployment.Kind.PUSH,
                                        state=Deployment.State.PENDING)
    if keep_snapshot is not None:
        pending = pending.exclude(snapshot=keep_snapshot)
    if keep_pinned:
        pending = pending.filter(agent__pinned_snapshot__isnull=False).exclude(
            snapshot=F("agent__pinned_snapshot"))
    return pending.update(state=Deployment.State.SUPERSEDED)


def agent_update(*, agent: Agent, actor, **changes) -> Agent:
    """Change mode, enabled or labels. Switching to manual keeps the agent on what
    it desires now; switching to auto_pull closes pushes of other snapshots."""
    unknown = set(changes) - {"mode", "enabled", "labels"}
    if unknown:
        raise ValidationFailed(f"Cannot change {', '.join(sorted(unknown))}.")
    if "mode" in changes and changes["mode"] not in Agent.Mode.values:
        raise ValidationFailed(f"mode must be one of {', '.join(Agent.Mode.values)}.")
    if "labels" in changes:
        check_labels(changes["labels"])
    with transaction.atomic():
        environment = Environment.objects.lock(agent.environment_id)
        locked = Agent.objects.lock(agent.pk)
        refused = rules.decommissioned_refusal([locked], f"change {', '.join(changes)}")
        if refused is not None:
            raise refused
        changed = [f for f, v in changes.items() if getattr(locked, f) != v]
        if not changed:
            return locked
        fields = list(changed)
        active = environment.active_snapshot
        if "mode" in changed:
            if changes["mode"] == Agent.Mode.MANUAL:
                locked.target_snapshot = active
                fields.append("target_snapshot")
            else:
                if rules.refuses(locked, active.number if active else None):
                    raise Conflict(
                        f"{locked.name} has #{locked.applied_number}, newer than the active "
                        f"snapshot; it would refuse to go back. Activate a newer snapshot or "
                        "roll back first.", code="rollback_required")
                pushes_supersede([locked.pk], keep_snapshot=active)
            locked.generation += 1
            fields.append("generation")
        for field in changed:
            setattr(locked, field, changes[field])
        locked.save(update_fields=fields)
        audit_record(actor=actor, action=Action.AGENT_UPDATE, obj=locked,
                     environment=locked.environment,
                     summary=f"Changed {', '.join(changed)} of {locked}",
                     data={f: changes[f] for f in changed})
        agent_changed_on_commit(locked)
    return locked


def environment_activate(*, environment: Environment, snapshot: Snapshot) -> int:
    """Make `snapshot` what auto_pull agents follow (its content recorded as active
    once); returns how many follow it. An inner step: the caller holds the lock,
    passed the release gate (apps.governance.gates) and writes the audit event."""
    locks.require_transaction()
    environment.active_snapshot = snapshot
    environment.save(update_fields=["active_snapshot"])
    content_activated(environment, snapshot)
    followers = Agent.objects.filter(environment=environment).following_active()
    ids = list(followers.values_list("pk", flat=True))
    _bump(ids)
    pushes_supersede(ids, keep_snapshot=snapshot)
    refresh_polls_on_commit(followers)
    emit("snapshot", environment_id=environment.pk, number=snapshot.number)
    emit("agent", environment_id=environment.pk)
    logger.info("%s: #%s active for %d auto_pull agent(s)", environment.full_name,
                snapshot.number, len(ids))
    return len(ids)


def agents_chosen(environment: Environment, agent_ids: list[int] | None = None, *,
                  queryset=None, field: str = "agents") -> list[Agent]:
    """The agents an operation names in `field` (every enabled one in service when it
    names none), locked in primary-key order: 400 unknown_agents naming the field and
    the ids outside the environment, 409 decommissioned, no_agents when none is left."""
    agents = (Agent.objects if queryset is None else queryset).filter(environment=environment)
    agents = (agents.filter(pk__among=agent_ids) if agent_ids
              else agents.in_service().filter(enabled=True))
    agents = agents.lock_all()
    missing = sorted(set(agent_ids or []) - {a.pk for a in agents})
    refused = (rules.strangers_refusal(environment.full_name, {field: missing})
               or rules.decommissioned_refusal(agents, "include them"))
    if refused is not None:
        raise refused
    if not agents:
        raise ValidationFailed(f"{environment.full_name} has no enabled agents.",
                               code="no_agents")
    return agents


def pushes_create(*, snapshot: Snapshot, agents: list[Agent], actor) -> list[Deployment]:
    """A pending push of `snapshot` to each of `agents` (locked; the caller checked
    push_refusal): earlier pending pushes are superseded, manual agents target it."""
    locks.require_transaction()
    ids = [a.pk for a in agents]
    pushes_supersede(ids)
    deployments = Deployment.objects.bulk_create([
        Deployment(agent=a, snapshot=snapshot, kind=Deployment.Kind.PUSH,
                   created_by=actor if getattr(actor, "is_authenticated", False) else None)
        for a in agents
    ])
    Agent.objects.filter(pk__among=ids, mode=Agent.Mode.MANUAL).update(
        target_snapshot=snapshot)
    _bump(ids)
    refresh_polls_on_commit(Agent.objects.filter(pk__among=ids))
    emit("agent", environment_id=snapshot.environment_id)
    return deployments


# --- pins --------------------------------------------------------------------------


def pins_set(agent_ids, *, snapshot, rollout=None, actor=None) -> int:
    """Point these agents' pins at `snapshot`, held by `rollout` or by `actor`, in one
    UPDATE; `snapshot` and `rollout` None release them. `agent_ids` is a list or a
    query of ids, `snapshot` a Snapshot, None, or an expression naming each agent's
    own snapshot id (a rollout freezing its targets): a constant number of queries
    however many agents. Pushes of other snapshots than the pinned one will never
    apply under a pin, so they are superseded. Returns how many agents changed."""
    locks.require_transaction()
    agents = Agent.objects.filter(pk__among=agent_ids).order_by()
    ids = list(agents.values_list("pk", flat=True))  # before the pins move
    each_own = hasattr(snapshot, "resolve_expression")
    holding = snapshot is not None or rollout is not None
    pinned_at = timezone.now() if snapshot is not None else None
    if each_own:
        pinned_at = Case(When(IsNull(snapshot, False), then=Value(pinned_at)), default=None)
    changed = agents.update(
        pinned_snapshot=snapshot, pin_rollout=rollout,
        pinned_by=actor if holding and getattr(actor, "is_authenticated", False) else None,
        pinned_at=pinned_at, generation=F("generation") + 1)
    if snapshot is not None:
        pushes_supersede(agent_ids, keep_snapshot=None if each_own else snapshot,
                         keep_pinned=each_own)
    refresh_polls_on_commit(Agent.objects.filter(pk__among=ids))
    return changed


def agent_pin_hold(*, agent: Agent, snapshot: Snapshot, actor) -> Agent:
    """Hold `agent` (locked; the caller checked the pin's refusals) on `snapshot`."""
    pins_set([agent.pk], snapshot=snapshot, actor=actor)
    audit_record(actor=actor, action=Action.AGENT_PIN, obj=agent, environment=agent.environment,
                 summary=f"Pinned {agent} to #{snapshot.number}",
                 data={"number": snapshot.number})
    emit("agent", environment_id=agent.environment_id, id=agent.pk)
    agent.refresh_from_db()
    return agent


def agent_pin_release(*, agent: Agent, expected_generation: int, actor) -> Agent:
    """Release the agent's pin: it follows its manual target or the active snapshot."""
    with transaction.atomic():
        locked = Agent.objects.lock(agent.pk)
        rules.check_generation(locked, expected_generation)
        if locked.pin_rollout_id is not None:
            raise Conflict(rules.holder_text(locked) + ".", code="rollout_pin")
        if locked.pinned_snapshot_id is None:
            raise Conflict(f"{locked.name} is not pinned.", code="not_pinned")
        number = locked.pinned_snapshot.number
        pins_set([locked.pk], snapshot=None)
        audit_record(actor=actor, action=Action.AGENT_PIN_RELEASE, obj=locked,
                     environment=locked.environment,
                     summary=f"Released the pin of {locked} (#{number})",
                     data={"number": number})
        emit("agent", environment_id=locked.environment_id, id=locked.pk)
    locked.refresh_from_db()
    return locked
