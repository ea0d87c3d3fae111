"""Rollout transitions: create, confirm, advance, complete, roll back, release a
pin or all remaining pins, delete (the automatic driver is apps.rollouts.reconcile). Each locks the
environment, then the rollout row (the order of apps.core.locks), checks the
transition and the CAS `version`, changes pins with set-based updates, and
writes its audit event in the same transaction.
"""

import logging

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.events import announce, emit
from apps.environments.models import Environment
from apps.fleet.models import Agent
from apps.fleet.rules import check_generation, held_refusal, is_held, refuses
from apps.fleet.selectors import refuse_agents_outside
from apps.fleet.services import agents_chosen, environment_activate, pins_set
from apps.governance.gates import release_gate
from apps.governance.rules import rollout_plan
from apps.rollouts import bounds, inflight, rules, selectors
from apps.rollouts.models import Rollout, RolloutStrategy, RolloutTarget
from apps.rollouts.quarantine import quarantine_record, refuse_quarantined
from apps.rollouts.rules import WaveEvidence
from apps.rollouts.targets import pins_release, targets_store
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.services import (
    publication_activated,
    publication_create,
    publication_rendered,
    publication_store,
)
from apps.tenancy.models import Tenant

logger = logging.getLogger(__name__)
# The failed agents' reports a rolled_back webhook carries (the API has up to 100).
WEBHOOK_FAILURES_SHOWN = 10


def _limits() -> dict:
    return settings.BELLWETHER_ROLLOUT_LIMITS


# --- create ----------------------------------------------------------------------------


def _check_environment(env: Environment, snapshot: Snapshot, actor,
                       override_reason: str | None) -> None:
    """What the environment (locked) says about starting a rollout of `snapshot`."""
    if not snapshot.is_ready or snapshot.environment_id != env.pk:
        raise ValidationFailed(f"#{snapshot.number} is not a ready snapshot of "
                               f"{env.full_name}.")
    refuse_quarantined(snapshot, actor=actor, override_reason=override_reason,
                       what="rolled out")
    if Rollout.objects.active_in(env).exists():
        raise Conflict(f"{env.full_name} already has an active rollout.", code="rollout_active")
    bounds.refuse_too_many_active(env.application.tenant)
    active = env.active_snapshot
    if active is not None and snapshot.number < active.number:
        raise Conflict(f"#{snapshot.number} is older than the active #{active.number}; "
                       "roll back instead.", code="rollback_required")


def _check_count(count: int) -> None:
    if count > _limits()["max_targets"]:
        raise ValidationFailed(f"{count} targets; at most {_limits()['max_targets']}.",
                               code="too_many_targets")


# What the checks of a rollout's targets read, as named tuples (no model instances):
# not their snapshots (the targets' rows take those in SQL), so that 10,000 agents
# load as 10,000 small rows.
CHECKED = ("pk", "name", "generation", "labels", "pinned_snapshot_id", "pin_rollout_id",
           "pinned_by_id", "applied_number", "applied_checksum", "decommissioned_at")


def _refuse_held(agents: list, snapshot: Snapshot) -> None:
    """409 agent_pinned when targets are held, naming (from their rows) who holds them."""
    held = [agent.pk for agent in agents if is_held(agent)]
    if held:
        raise held_refusal(list(Agent.objects.select_related("pinned_by")
                                .filter(pk__in=held[:100]).order_by("pk")),
                           f"roll out #{snapshot.number}")


def _targets(env: Environment, targets: list[dict] | None, snapshot: Snapshot) -> list:
    """The rollout's agents, locked, as rows of CHECKED: those `targets` names
    [{agent, expected_generation}] at exactly those generations, or every enabled agent."""
    if targets is not None and not targets:
        raise ValidationFailed("targets is empty; leave it out to target every enabled agent.")
    _check_count(len(targets or []))
    expected = {t["agent"]: t["expected_generation"] for t in targets} if targets else None
    agents = agents_chosen(env, list(expected) if expected else None, field="targets",
                           queryset=Agent.objects.values_list(*CHECKED, named=True))
    _check_count(len(agents))
    stale = [{"agent": a.pk, "name": a.name, "generation": a.generation,
              "expected_generation": expected[a.pk]}
             for a in agents if expected is not None and a.generation != expected[a.pk]]
    if stale:
        raise Conflict(f"{len(stale)} target(s) changed since you loaded them.",
                       code="stale", details=stale)
    _refuse_held(agents, snapshot)
    ahead = [a.name for a in agents if refuses(a, snapshot.number)]
    if ahead:
        raise Conflict(f"{', '.join(ahead)} already have a newer snapshot; they refuse "
                       "lower numbers.", code="rollback_required")
    if rules.nothing_to_roll_out(snapshot.number, snapshot.checksum, agents):
        raise Conflict(f"Every target already runs #{snapshot.number}; no target would "
                       "apply and acknowledge it, so there is nothing to roll out.",
                       code="nothing_to_roll_out")
    return agents


def _rollout_store(env: Environment, snapshot: Snapshot, plan: list[dict],
                   assignment: list[tuple], actor, **fields) -> Rollout:
    """The rollout row and its targets; every target frozen on what it desires
    now with a pin, then the canaries moved to the new snapshot."""
    try:
        with transaction.atomic():
            rollout = Rollout.objects.create(
                environment=env, snapshot=snapshot, previous_snapshot=env.active_snapshot,
                waves=plan, wave_started_at=timezone.now(), **fields,
                created_by=actor if getattr(actor, "is_authenticated", False) else None)
    except IntegrityError:
        raise Conflict(f"{env.full_name} already has an active rollout.",
                       code="rollout_active") from None
    targets_store(rollout, assignment)
    inflight.wave_open(rollout, 0)
    return rollout


def rollout_create(
    *, environment: Environment, snapshot: Snapshot, actor, targets: list[dict] | None = None,
    canary_agents: list[int] | None = None, canary_labels: dict | None = None,
    waves: list[dict] | None = None, failure_threshold: int = 0,
    canary_gate: str = Rollout.Gate.MANUAL, bake_s: int = 0, wave_timeout_s: int = 3600,
    override_reason: str | None = None, canary_count: int | None = None,
    canary_percent: int | None = None, strategy: RolloutStrategy | None = None,
    confirmed: bool = False,
) -> Rollout:
    """Stage `snapshot` over the environment's agents (all enabled ones, or `targets`
    [{agent, expected_generation}]). Freezes every target's desired snapshot with a
    pin, then pins the canaries (named, or the first canary_count / canary_percent
    by name) to the new one — all in one transaction. Quarantined content is refused
    unless `override_reason` (an owner's) is given; agents of other environments are
    400; then the release gate (a degenerate render only `confirmed`). `strategy` is
    recorded only: the caller merged its options (strategies.rollout_options_for)."""
    waves = waves or [{"percent": 100, "gate": Rollout.Gate.AUTO, "bake_s": 0}]
    problem = rules.wave_specs_problem(waves)
    if problem:
        raise ValidationFailed(problem)
    if not (canary_agents or canary_labels or canary_count or canary_percent):
        raise ValidationFailed("Name the canaries: agent ids, labels, or a count.",
                               code="no_canaries")
    with transaction.atomic():
        # The tenant first: its active rollouts are counted against a tenant-wide bound.
        locks.lock_one(Tenant.objects, applications__environments=environment.pk)
        env = Environment.objects.lock(environment.pk)
        _check_environment(env, snapshot, actor, override_reason)
        _check_count(len(targets or []))  # before a lookup of that many
        refuse_agents_outside(env, targets=[t["agent"] for t in targets or []],
                              canary_agents=canary_agents)
        release_gate(environment=env, snapshot=snapshot, actor=actor, what="rollout",
                     confirmed=confirmed, plan=rollout_plan(
                         targets=[t["agent"] for t in targets or []], canary_agents=canary_agents,
                         canary_labels=canary_labels, waves=waves, canary_gate=canary_gate,
                         bake_s=bake_s, failure_threshold=failure_threshold,
                         wave_timeout_s=wave_timeout_s))
        agents = _targets(env, targets, snapshot)
        bounds.history_prune(env, actor)
        size = canary_count or (canary_percent and -(-len(agents) * canary_percent // 100))
        canaries, others = rules.canaries_chosen(agents, canary_agents, canary_labels, size)
        plan = rules.plan_waves(total=len(agents), canaries=len(canaries), waves=waves,
                                canary_gate=canary_gate, bake_s=bake_s)
        rollout = _rollout_store(env, snapshot, plan, rules.assign_waves(canaries, others, plan),
                                 actor, wave_timeout_s=wave_timeout_s,
                                 failure_threshold=failure_threshold, strategy=strategy)
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        announce("rollout.started", environment_id=env.pk, rollout=rollout.pk,
                 snapshot=snapshot.number, waves=[w["size"] for w in plan],
                 strategy=strategy.name if strategy else None)
        audit_record(actor=actor, action=Action.ROLLOUT_CREATE, obj=rollout, environment=env,
                     tenant=env.application.tenant,
                     summary=f"Rollout of #{snapshot.number} to {len(agents)} agent(s) in "
                             f"{len(plan)} wave(s); {len(canaries)} canary(ies)",
                     data={"snapshot": snapshot.number, "waves": [w["size"] for w in plan]})
    logger.info("rollout %s of %s #%s started: waves %s", rollout.pk, env.full_name,
                snapshot.number, [w["size"] for w in plan])
    return rollout


# --- transitions -----------------------------------------------------------------------


def locked_rollout(rollout_id: int, expected_version: int | None) -> Rollout:
    rollout = Rollout.objects.lock(rollout_id)
    if rollout is None:
        raise NotFound(f"Rollout {rollout_id} not found.")
    if expected_version is not None and rollout.version != expected_version:
        raise Conflict(f"Rollout {rollout_id} changed since you loaded it (version "
                       f"{rollout.version}, not {expected_version}).", code="stale",
                       details=[{"version": rollout.version}])
    return rollout


def transition(rollout: Rollout, actor, action: Action, summary: str, **fields) -> None:
    """Save the rollout's new state with its version bumped; announce and audit it."""
    for name, value in fields.items():
        setattr(rollout, name, value)
    rollout.version += 1
    rollout.save(update_fields=[*fields, "version"])
    emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
    audit_record(actor=actor, action=action, obj=rollout, environment=rollout.environment,
                 summary=summary)


def advance(rollout: Rollout, actor, why: str, evidence: WaveEvidence | None = None) -> Rollout:
    """Open the next wave, or complete the rollout after the last one (`evidence`:
    the current wave's, read by the caller in this transaction)."""
    if rollout.current_wave + 1 >= len(rollout.waves):
        return _complete(rollout, actor, evidence)
    wave = rollout.current_wave + 1
    rollout.current_wave = wave
    count = inflight.wave_open(rollout, wave)
    transition(rollout, actor, Action.ROLLOUT_ADVANCE,
                f"Rollout {rollout.pk} at {rules.wave_name(wave, len(rollout.waves))} "
                f"({count} agent(s)): {why}", current_wave=wave, wave_started_at=timezone.now(),
                state=Rollout.State.RUNNING, reason="")
    announce("rollout.wave_advanced", environment_id=rollout.environment_id,
             rollout=rollout.pk, snapshot=rollout.snapshot.number, wave=wave,
             waves=len(rollout.waves), why=why)
    return rollout


def _complete(rollout: Rollout, actor, evidence: WaveEvidence | None) -> Rollout:
    """The snapshot becomes the environment's active one and the pins are released
    (every target is activated by now), its per-wave summary kept first."""
    environment_activate(environment=rollout.environment, snapshot=rollout.snapshot)
    summary = selectors.rollout_summary(
        rollout, known=None if evidence is None else {rollout.current_wave: evidence})
    pins_release(rollout, RolloutTarget.objects.filter(rollout=rollout), rollout.snapshot)
    transition(rollout, actor, Action.ROLLOUT_COMPLETE,
                f"Rollout {rollout.pk} completed: #{rollout.snapshot.number} active",
                state=Rollout.State.COMPLETED, finished_at=timezone.now(), final_summary=summary)
    announce("rollout.completed", environment_id=rollout.environment_id, rollout=rollout.pk,
             snapshot=rollout.snapshot.number)
    logger.info("rollout %s completed", rollout.pk)
    return rollout


def rollout_confirm(*, rollout: Rollout, expected_version: int, actor) -> Rollout:
    """Confirm the current wave: only with fresh, exact acknowledgements from every
    agent of it, received after its activation."""
    with transaction.atomic():
        Environment.objects.lock(rollout.environment_id)
        locked = locked_rollout(rollout.pk, expected_version)
        if not locked.is_active:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}.", code="rollout_finished")
        release_gate(environment=locked.environment, snapshot=locked.snapshot, plan=None,
                     actor=actor, what="wave advance")
        evidence = selectors.wave_evidence(locked)
        if not evidence.complete:
            blockers = evidence.blockers()
            raise Conflict("The wave cannot be confirmed: "
                           + rules.describe(blockers, rules.BLOCKER_REASONS) + ".",
                           code="not_acknowledged",
                           details=[{"reason": k, "agents": names[:100]}
                                    for k, names in blockers])
        announce("rollout.confirmed", environment_id=locked.environment_id,
                 rollout=locked.pk, snapshot=locked.snapshot.number, wave=locked.current_wave)
        return advance(locked, actor, "confirmed", evidence)


def _replacement(environment: Environment, previous: Snapshot, actor) -> Snapshot:
    """Re-render `previous` as a new, higher snapshot and make it active. Rendered
    here, not on a worker: it is bounded, and a rollback must not wait on a queue.
    Active at once whatever the environment's activation policy: a rollback is an
    explicit release (as apps.releases.rules.publication_activates says for an
    environment rollback)."""
    publication = publication_create(environment=environment, actor=actor,
                                     kind=Publication.Kind.ROLLBACK, source=previous.source,
                                     rolled_back_from=previous, activates=True)
    publication, _ = publication_store(environment=environment, publication_id=publication.pk,
                                       rendered=publication_rendered(publication))
    if publication.state != Publication.State.READY:
        raise Conflict(f"Re-rendering #{previous.number} failed; the rollout is unchanged.",
                       code="rollback_failed")
    environment_activate(environment=environment, snapshot=publication.snapshot)
    publication_activated(publication)
    return publication.snapshot


def rollout_rollback(*, rollout: Rollout, expected_version: int | None, actor,
                     reason: str = "") -> Rollout:
    """Roll back: re-render the previous content as a new, higher snapshot, make it
    active, keep the per-wave summary, and release the rollout's pins so every target
    follows the environment again (only the activated targets' pins when the
    environment keeps rollout pins); the rolled-back snapshot is quarantined. Under the rollout's
    lock with the version checked first: of two rollbacks (or a rollback and a
    confirm) at one version exactly one wins, and only it renders."""
    with transaction.atomic():
        environment = Environment.objects.lock(rollout.environment_id)
        locked = locked_rollout(rollout.pk, expected_version)
        if not locked.is_active:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}.", code="rollout_finished")
        previous = locked.previous_snapshot
        replacement = _replacement(environment, previous, actor) if previous else None
        summary = selectors.rollout_summary(locked)
        targets = RolloutTarget.objects.filter(rollout=locked)
        if environment.keep_rollout_pins:
            targets = targets.filter(state=RolloutTarget.State.ACTIVATED)
        pins_release(locked, targets, replacement)
        quarantine_record(rollout=locked, reason=reason)
        transition(locked, actor, Action.ROLLOUT_ROLLBACK,
                    f"Rollout {locked.pk} rolled back"
                    + (f" to #{replacement.number}" if replacement else "")
                    + (f": {reason}" if reason else ""),
                    state=Rollout.State.ROLLED_BACK, finished_at=timezone.now(),
                    rollback_snapshot=replacement, reason=reason, final_summary=summary)
        announce("rollout.rolled_back", environment_id=locked.environment_id,
                 rollout=locked.pk, snapshot=locked.snapshot.number,
                 rollback_snapshot=replacement.number if replacement else None, reason=reason,
                 failures=summary["failures"][:WEBHOOK_FAILURES_SHOWN])
    logger.warning("rollout %s rolled back%s", locked.pk, f": {reason}" if reason else "")
    return locked


# --- pins and history ------------------------------------------------------------------


def rollout_pin_release(*, agent: Agent, rollout: Rollout, expected_generation: int,
                        actor) -> Agent:
    """Release a rollout's pin on one agent. A released canary is abandoned: the
    wave can no longer be confirmed; a rollback leaves it alone."""
    with transaction.atomic():
        Environment.objects.lock(agent.environment_id)
        locked = Agent.objects.lock(agent.pk)
        if locked.pin_rollout_id != rollout.pk:
            raise Conflict(f"{locked.name} is not pinned by rollout {rollout.pk}.",
                           code="not_pinned")
        check_generation(locked, expected_generation)
        pins_set([locked.pk], snapshot=None)
        RolloutTarget.objects.filter(rollout=rollout, agent=locked).update(
            state=RolloutTarget.State.RELEASED)
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        audit_record(actor=actor, action=Action.ROLLOUT_RELEASE, obj=rollout,
                     environment=locked.environment,
                     summary=f"Released {locked.name} from rollout {rollout.pk}")
    locked.refresh_from_db()
    return locked


def rollout_pins_release(*, rollout: Rollout, expected_version: int, actor) -> Rollout:
    """Release every pin a finished rollout still holds (when its environment keeps
    rollout pins): each target follows the environment's active snapshot, or its
    manual target, again. At the rollout's version: of two such actions one wins."""
    with transaction.atomic():
        Environment.objects.lock(rollout.environment_id)
        locked = locked_rollout(rollout.pk, expected_version)
        if locked.is_active:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}; roll it back or finish "
                           "it to release its pins.", code="rollout_active")
        released = pins_release(locked, RolloutTarget.objects.filter(rollout=locked), None)
        if not released:
            raise Conflict(f"Rollout {locked.pk} holds no pins.", code="not_pinned")
        transition(locked, actor, Action.ROLLOUT_PINS_RELEASE,
                   f"Released the {released} remaining pin(s) of rollout {locked.pk}")
    logger.info("rollout %s: %s pin(s) released", locked.pk, released)
    return locked


def rollout_delete(*, rollout: Rollout, actor) -> None:
    """Delete a finished rollout's history once none of its pins remain."""
    with transaction.atomic():
        Environment.objects.lock(rollout.environment_id)
        locked = locked_rollout(rollout.pk, None)
        if locked.is_active:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}; finish it first.",
                           code="rollout_active")
        pinned = selectors.pins_held(locked)
        if pinned:
            raise Conflict(f"{pinned} agent(s) are still held by rollout {locked.pk}; "
                           "release that rollout's pins first (POST /api/v1/rollouts/"
                           f"{locked.pk}/release-pins).", code="pins_remain")
        emit("rollout", environment_id=locked.environment_id, id=locked.pk)
        audit_record(actor=actor, action=Action.ROLLOUT_DELETE, obj=locked,
                     environment=locked.environment,
                     summary=f"Deleted rollout {locked.pk} of #{locked.snapshot.number}")
        locked.delete()
