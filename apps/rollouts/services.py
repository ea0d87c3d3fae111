"""Rollout transitions: create, confirm, advance, complete, roll back, reconcile,
release a pin, delete. Each locks the rollout row (after the environment's, the
order every writer uses), checks the transition and the CAS `version`, changes
pins with set-based updates, and writes its audit event in the same transaction.
"""

import logging
import math
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, OuterRef, Subquery
from django.utils import timezone

from apps.audit.services import audit_record
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.events import emit
from apps.environments.models import Environment
from apps.fleet.models import Agent, Deployment
from apps.fleet.selectors import agents_with_desired, desired_snapshot_for
from apps.fleet.services import (
    check_generation,
    environment_activate,
    forget_polls_on_commit,
)
from apps.rollouts import selectors
from apps.rollouts.models import ACTIVE_STATES, Rollout, RolloutTarget, SnapshotQuarantine
from apps.snapshots.models import Snapshot
from apps.snapshots.services import locked_environment, publication_render, snapshot_rollback

logger = logging.getLogger(__name__)


def _limits() -> dict:
    return settings.BELLWETHER_ROLLOUT_LIMITS


def _enqueue_reconcile(rollout: Rollout) -> None:
    from apps.rollouts.tasks import rollout_reconcile_task

    rollout_reconcile_task.delay_on_commit(rollout.pk)


def _pin(agent_ids, snapshot: Snapshot | None, rollout: Rollout | None) -> None:
    """Point these agents' pins at `snapshot` (None: release) in one UPDATE."""
    Agent.objects.filter(pk__in=agent_ids).update(
        pinned_snapshot=snapshot, pin_rollout=rollout, pinned_by=None,
        pinned_at=timezone.now() if snapshot is not None else None,
        generation=F("generation") + 1,
    )
    if snapshot is not None:  # pins win: pushes of other snapshots will never apply
        Deployment.objects.filter(agent_id__in=agent_ids, kind=Deployment.Kind.PUSH,
                                  state=Deployment.State.PENDING).exclude(
            snapshot=snapshot).update(state=Deployment.State.SUPERSEDED)
    forget_polls_on_commit(Agent.objects.filter(pk__in=agent_ids)
                           .values_list("token_key", flat=True))


def _record_generations(targets) -> None:
    """Remember each target's agent generation now that its pin is set."""
    targets.update(generation=Subquery(
        Agent.objects.filter(pk=OuterRef("agent_id")).values("generation")[:1]))


def _activate_wave(rollout: Rollout, wave: int) -> int:
    targets = RolloutTarget.objects.filter(rollout=rollout, wave=wave,
                                           state=RolloutTarget.State.PENDING)
    agent_ids = list(targets.values_list("agent_id", flat=True))
    _pin(agent_ids, rollout.snapshot, rollout)
    targets.update(state=RolloutTarget.State.ACTIVATED, activated_at=timezone.now())
    _record_generations(RolloutTarget.objects.filter(rollout=rollout, wave=wave,
                                                     agent_id__in=agent_ids))
    return len(agent_ids)


def _wave_sizes(total: int, canaries: int, waves: list[dict]) -> list[int]:
    remaining, sizes = total - canaries, [canaries]
    for index, wave in enumerate(waves):
        if remaining <= 0:
            break
        if index == len(waves) - 1:
            size = remaining
        elif "percent" in wave:
            size = max(1, math.ceil(total * wave["percent"] / 100))
        else:
            size = wave["count"]
        size = min(size, remaining)
        sizes.append(size)
        remaining -= size
    if remaining > 0:
        sizes.append(remaining)
    return sizes


def rollout_create(
    *, environment: Environment, snapshot: Snapshot, actor, targets: list[dict] | None = None,
    canary_agents: list[int] | None = None, canary_labels: dict | None = None,
    waves: list[dict] | None = None, failure_threshold: int = 0,
    canary_gate: str = Rollout.Gate.MANUAL, bake_s: int = 0, wave_timeout_s: int = 3600,
    override_quarantine: bool = False,
) -> Rollout:
    """Stage `snapshot` over the environment's agents (all enabled ones, or `targets`
    [{agent, expected_generation}]). Freezes every target's desired snapshot with a
    pin, then pins the canaries to the new one — all in one transaction."""
    waves = waves or [{"percent": 100, "gate": Rollout.Gate.AUTO, "bake_s": 0}]
    for wave in waves:
        if not (("percent" in wave and 0 < wave["percent"] <= 100)
                or ("count" in wave and wave["count"] >= 1)):
            raise ValidationFailed("Each wave needs a percent (1-100) or a count (>= 1).")
    if not canary_agents and not canary_labels:
        raise ValidationFailed("Name the canaries: agent ids or labels.", code="no_canaries")
    limits = _limits()
    with transaction.atomic():
        env = locked_environment(environment.pk)
        if not snapshot.is_ready or snapshot.environment_id != env.pk:
            raise ValidationFailed(f"#{snapshot.number} is not a ready snapshot of "
                                   f"{env.full_name}.")
        if not override_quarantine and SnapshotQuarantine.objects.filter(
                snapshot=snapshot).exists():
            raise Conflict(f"#{snapshot.number} was rolled back; roll it out again only with "
                           "an explicit override.", code="quarantined")
        if Rollout.objects.filter(environment=env, state__in=ACTIVE_STATES).exists():
            raise Conflict(f"{env.full_name} already has an active rollout.",
                           code="rollout_active")
        if Rollout.objects.filter(state__in=ACTIVE_STATES).count() >= limits["max_active"]:
            raise Conflict(f"At most {limits['max_active']} rollouts may be active at once.",
                           code="too_many_rollouts")
        if Rollout.objects.exclude(state__in=ACTIVE_STATES).count() >= limits["max_history"]:
            raise Conflict(f"At most {limits['max_history']} finished rollouts are kept; "
                           "delete old ones first.", code="history_full")

        active = env.active_snapshot
        if active is not None and snapshot.number < active.number:
            raise Conflict(f"#{snapshot.number} is older than the active #{active.number}; "
                           "roll back instead.", code="rollback_required")
        if targets is not None and not targets:
            raise ValidationFailed("targets is empty; leave it out to target every enabled "
                                   "agent.")
        if targets is not None and len(targets) > limits["max_targets"]:
            raise ValidationFailed(f"{len(targets)} targets; at most {limits['max_targets']}.",
                                   code="too_many_targets")
        agents = Agent.objects.filter(environment=env)
        expected = None
        if targets:
            expected = {t["agent"]: t["expected_generation"] for t in targets}
            agents = agents.filter(pk__in=expected)
        else:
            agents = agents.filter(enabled=True)
        agents = list(agents_with_desired(agents).select_for_update(of=("self",))
                      .order_by("pk"))
        if expected is not None and len(agents) != len(expected):
            missing = sorted(set(expected) - {a.pk for a in agents})
            raise NotFound(f"No agents {missing} in {env.full_name}.")
        if not agents:
            raise ValidationFailed(f"{env.full_name} has no enabled agents.", code="no_agents")
        if len(agents) > limits["max_targets"]:
            raise ValidationFailed(f"{len(agents)} targets; at most {limits['max_targets']}.",
                                   code="too_many_targets")
        stale = [{"agent": a.pk, "name": a.name, "generation": a.generation,
                  "expected_generation": expected[a.pk]}
                 for a in agents if expected is not None and a.generation != expected[a.pk]]
        if stale:
            raise Conflict(f"{len(stale)} target(s) changed since you loaded them.",
                           code="stale", details=stale)
        held = [a.name for a in agents
                if a.pinned_snapshot_id is not None or a.pin_rollout_id is not None]
        if held:
            raise Conflict(f"Pinned agents cannot be rolled out to: {', '.join(held)}.",
                           code="agent_pinned")
        ahead = [a.name for a in agents
                 if a.applied_number is not None and a.applied_number > snapshot.number]
        if ahead:
            raise Conflict(f"{', '.join(ahead)} already have a newer snapshot; they refuse "
                           "lower numbers.", code="rollback_required")

        canary_ids = set(canary_agents or [])

        def is_canary(agent: Agent) -> bool:
            if agent.pk in canary_ids:
                return True
            return bool(canary_labels) and all(agent.labels.get(k) == v
                                               for k, v in canary_labels.items())

        strangers = canary_ids - {a.pk for a in agents}
        if strangers:
            raise ValidationFailed(f"Canaries {sorted(strangers)[:20]} are not among the "
                                   "targets.", code="canary_not_target")
        canaries = [a for a in agents if is_canary(a)]
        if not canaries:
            raise ValidationFailed("The canary wave would be empty.", code="no_canaries")
        others = sorted((a for a in agents if not is_canary(a)), key=lambda a: (a.name, a.pk))
        sizes = _wave_sizes(len(agents), len(canaries), waves)
        plan = [{"size": len(canaries), "gate": canary_gate, "bake_s": bake_s}]
        for index, size in enumerate(sizes[1:]):
            spec = waves[min(index, len(waves) - 1)]
            plan.append({"size": size, "gate": spec.get("gate", Rollout.Gate.AUTO),
                         "bake_s": spec.get("bake_s", 0)})
        now = timezone.now()
        try:
            with transaction.atomic():
                rollout = Rollout.objects.create(
                    environment=env, snapshot=snapshot, previous_snapshot=env.active_snapshot,
                    waves=plan, wave_started_at=now, wave_timeout_s=wave_timeout_s,
                    failure_threshold=failure_threshold,
                    created_by=actor if getattr(actor, "is_authenticated", False) else None)
        except IntegrityError:
            raise Conflict(f"{env.full_name} already has an active rollout.",
                           code="rollout_active") from None
        assignment, offset = [(a, 0) for a in canaries], 0
        for wave, size in enumerate(sizes[1:], start=1):
            assignment += [(a, wave) for a in others[offset:offset + size]]
            offset += size
        RolloutTarget.objects.bulk_create([
            RolloutTarget(rollout=rollout, agent=a, wave=w,
                          previous_snapshot=desired_snapshot_for(a)) for a, w in assignment
        ], batch_size=1000)
        # Freeze: every target holds what it has now...
        by_previous: dict = {}
        for agent, _ in assignment:
            by_previous.setdefault(desired_snapshot_for(agent), []).append(agent.pk)
        for previous, ids in by_previous.items():
            _pin(ids, previous, rollout)
        _record_generations(RolloutTarget.objects.filter(rollout=rollout))
        # ...and the canaries move to the new snapshot.
        _activate_wave(rollout, 0)
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        audit_record(actor=actor, action="rollout.create", obj=rollout, environment=env,
                     tenant=env.application.tenant,
                     summary=f"Rollout of #{snapshot.number} to {len(agents)} agent(s) in "
                             f"{len(plan)} wave(s); {len(canaries)} canary(ies)",
                     data={"snapshot": snapshot.number, "waves": [w["size"] for w in plan]})
    logger.info("rollout %s of %s #%s started: waves %s", rollout.pk, env.full_name,
                snapshot.number, [w["size"] for w in plan])
    return rollout


def _locked(rollout_id: int, expected_version: int | None) -> Rollout:
    rollout = (Rollout.objects.select_for_update(of=("self",))
               .select_related("snapshot", "environment").filter(pk=rollout_id).first())
    if rollout is None:
        raise NotFound(f"Rollout {rollout_id} not found.")
    if expected_version is not None and rollout.version != expected_version:
        raise Conflict(f"Rollout {rollout_id} changed since you loaded it (version "
                       f"{rollout.version}, not {expected_version}).", code="stale",
                       details=[{"version": rollout.version}])
    return rollout


def _advance(rollout: Rollout, actor, why: str) -> Rollout:
    """Open the next wave, or complete the rollout after the last one."""
    now = timezone.now()
    if rollout.current_wave + 1 < len(rollout.waves):
        rollout.current_wave += 1
        rollout.wave_started_at = now
        rollout.version += 1
        rollout.state = Rollout.State.RUNNING
        rollout.reason = ""
        rollout.save(update_fields=["current_wave", "wave_started_at", "version", "state",
                                    "reason"])
        count = _activate_wave(rollout, rollout.current_wave)
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        audit_record(actor=actor, action="rollout.advance", obj=rollout,
                     environment=rollout.environment,
                     summary=f"Wave {rollout.current_wave + 1} of {len(rollout.waves)} "
                             f"({count} agent(s)) of rollout {rollout.pk}: {why}")
        return rollout
    return _complete(rollout, actor)


def _complete(rollout: Rollout, actor) -> Rollout:
    """The snapshot becomes the environment's active one and the pins are released."""
    env = rollout.environment
    environment_activate(environment=env, snapshot=rollout.snapshot)
    agent_ids = list(Agent.objects.filter(pin_rollout=rollout).values_list("pk", flat=True))
    # Manual agents follow their target once released: keep them on the new snapshot.
    Agent.objects.filter(pk__in=agent_ids, mode=Agent.Mode.MANUAL).update(
        target_snapshot=rollout.snapshot)
    _pin(agent_ids, None, None)
    RolloutTarget.objects.filter(rollout=rollout).update(state=RolloutTarget.State.RELEASED)
    rollout.state, rollout.finished_at = Rollout.State.COMPLETED, timezone.now()
    rollout.version += 1
    rollout.save(update_fields=["state", "finished_at", "version"])
    emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
    audit_record(actor=actor, action="rollout.complete", obj=rollout, environment=env,
                 summary=f"Rollout {rollout.pk} completed: #{rollout.snapshot.number} active")
    logger.info("rollout %s completed", rollout.pk)
    return rollout


def rollout_confirm(*, rollout: Rollout, expected_version: int, actor) -> Rollout:
    """Confirm the current wave: only with fresh, exact acknowledgements from every
    agent of it, received after its activation."""
    with transaction.atomic():
        locked_environment(rollout.environment_id)
        locked = _locked(rollout.pk, expected_version)
        if locked.state != Rollout.State.RUNNING and locked.state != Rollout.State.PAUSED:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}.", code="rollout_finished")
        evidence = selectors.wave_evidence(locked)
        if not evidence.complete:
            reasons = []
            for label, names in (("released by an operator", evidence.released),
                                 ("reported a failure", evidence.failed),
                                 ("changed since activation", evidence.changed),
                                 ("not yet acknowledged (fresh and exact)", evidence.waiting)):
                if names:
                    reasons.append(f"{label}: {', '.join(names[:20])}")
            raise Conflict("The wave cannot be confirmed: " + "; ".join(reasons) + ".",
                           code="not_acknowledged",
                           details=[{"reason": k, "agents": getattr(evidence, k)[:100]}
                                    for k in ("released", "failed", "changed", "waiting")
                                    if getattr(evidence, k)])
        result = _advance(locked, actor, "confirmed")
    return result


def rollout_rollback(*, rollout: Rollout, expected_version: int | None, actor,
                     reason: str = "") -> Rollout:
    """Roll back: re-render the previous content as a new, higher snapshot, make it
    active, and release the pins of activated targets. Pending and released targets
    stay as they are; the rolled-back snapshot is quarantined."""
    # One transaction under the rollout's lock, the version checked first: of two
    # rollbacks (or a rollback and a confirm) at one version exactly one wins, and
    # only the winner creates the replacement snapshot. The render runs here, not
    # on a worker (it is bounded, and a rollback must not wait on a queue); the
    # task queued on commit then finds the publication finished.
    with transaction.atomic():
        locked_environment(rollout.environment_id)
        locked = _locked(rollout.pk, expected_version)
        if not locked.is_active:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}.", code="rollout_finished")
        # Finished before the replacement is rendered, so that it is activated.
        locked.state = Rollout.State.ROLLED_BACK
        locked.save(update_fields=["state"])
        previous, replacement = locked.previous_snapshot, None
        if previous is not None:
            publication = snapshot_rollback(snapshot=previous, actor=actor)
            publication = publication_render(publication_id=str(publication.pk))
            if publication.state != "ready":
                raise Conflict(f"Re-rendering #{previous.number} failed; the rollout is "
                               "unchanged.", code="rollback_failed")
            replacement = publication.snapshot
        activated = RolloutTarget.objects.filter(rollout=locked,
                                                 state=RolloutTarget.State.ACTIVATED)
        agent_ids = list(activated.filter(agent__pin_rollout=locked)
                         .values_list("agent_id", flat=True))
        if replacement is not None:
            Agent.objects.filter(pk__in=agent_ids, mode=Agent.Mode.MANUAL).update(
                target_snapshot=replacement)
        _pin(agent_ids, None, None)
        activated.update(state=RolloutTarget.State.RELEASED)
        SnapshotQuarantine.objects.get_or_create(
            snapshot=locked.snapshot, defaults={"rollout": locked, "reason": reason})
        locked.state, locked.finished_at = Rollout.State.ROLLED_BACK, timezone.now()
        locked.rollback_snapshot, locked.reason = replacement, reason
        locked.version += 1
        locked.save(update_fields=["state", "finished_at", "rollback_snapshot", "reason",
                                   "version"])
        emit("rollout", environment_id=locked.environment_id, id=locked.pk)
        audit_record(actor=actor, action="rollout.rollback", obj=locked,
                     environment=locked.environment,
                     summary=f"Rollout {locked.pk} rolled back"
                             + (f" to #{replacement.number}" if replacement else "")
                             + (f": {reason}" if reason else ""))
    logger.warning("rollout %s rolled back%s", locked.pk, f": {reason}" if reason else "")
    return locked


def rollout_reconcile(*, rollout_id: int) -> str:
    """Drive an active rollout by its automatic rules. Idempotent and safe to run
    concurrently: it works under the rollout's row lock. Returns what it did."""
    with transaction.atomic():
        rollout = Rollout.objects.filter(pk=rollout_id).select_related("environment").first()
        if rollout is None or not rollout.is_active:
            return "idle"
        locked_environment(rollout.environment_id)
        rollout = _locked(rollout_id, None)
        if not rollout.is_active:
            return "idle"
        if selectors.failures(rollout) <= rollout.failure_threshold:
            # A paused rollout waits for an operator, but still rolls back on failures.
            return _drive(rollout) if rollout.state == Rollout.State.RUNNING else "idle"
        version = rollout.version
    # Outside the lock: a rollback re-renders a snapshot and takes the locks itself.
    try:
        rollout_rollback(rollout=rollout, expected_version=version, actor=None,
                         reason=f"more than {rollout.failure_threshold} target(s) failed")
    except Conflict as exc:  # an operator (or another reconcile) acted first
        return f"skipped: {exc.code}"
    return "rolled_back"


def _drive(rollout: Rollout) -> str:
    """Advance an acknowledged, baked wave behind an automatic gate, or pause a wave
    that timed out. Called with the rollout locked."""
    wave = rollout.waves[rollout.current_wave]
    evidence = selectors.wave_evidence(rollout)
    now = timezone.now()
    baked = now - rollout.wave_started_at >= timedelta(seconds=wave.get("bake_s", 0))
    # Failures within the threshold are tolerated by an automatic gate.
    settled = evidence.acknowledged and not (evidence.waiting or evidence.released
                                             or evidence.changed)
    if settled and wave.get("gate") == Rollout.Gate.AUTO and baked:
        _advance(rollout, None, "acknowledged and baked")
        return "advanced"
    if now - rollout.wave_started_at > timedelta(seconds=rollout.wave_timeout_s):
        rollout.state, rollout.version = Rollout.State.PAUSED, rollout.version + 1
        blockers = "; ".join(f"{label}: {', '.join(names[:20])}" for label, names in (
            ("waiting", evidence.waiting), ("changed", evidence.changed),
            ("released", evidence.released), ("failed", evidence.failed)) if names)
        rollout.reason = (f"wave {rollout.current_wave + 1} not acknowledged within "
                          f"{rollout.wave_timeout_s}s ({blockers or 'waiting for a gate'})")
        rollout.save(update_fields=["state", "version", "reason"])
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        audit_record(actor=None, action="rollout.pause", obj=rollout,
                     environment=rollout.environment,
                     summary=f"Rollout {rollout.pk} paused: {rollout.reason}")
        return "paused"
    return "waiting"


def rollouts_reconcile() -> dict:
    """Reconcile every running rollout (the beat task and embedded loop call this)."""
    return {rollout_id: rollout_reconcile(rollout_id=rollout_id)
            for rollout_id in Rollout.objects.filter(state__in=ACTIVE_STATES)
            .values_list("pk", flat=True)}


def rollout_report_received(*, environment_id: int) -> None:
    """A report arrived: reconcile the environment's active rollout after commit."""
    rollout = Rollout.objects.filter(environment_id=environment_id,
                                     state__in=ACTIVE_STATES).first()
    if rollout is not None:
        _enqueue_reconcile(rollout)


def rollout_pin_release(*, agent: Agent, rollout: Rollout, expected_generation: int,
                        actor) -> Agent:
    """Release a rollout's pin on one agent. A released canary is abandoned: the
    wave can no longer be confirmed; a rollback leaves it alone."""
    with transaction.atomic():
        locked_environment(agent.environment_id)
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        if locked.pin_rollout_id != rollout.pk:
            raise Conflict(f"{locked.name} is not pinned by rollout {rollout.pk}.",
                           code="not_pinned")
        check_generation(locked, expected_generation)
        _pin([locked.pk], None, None)
        RolloutTarget.objects.filter(rollout=rollout, agent=locked).update(
            state=RolloutTarget.State.RELEASED)
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        audit_record(actor=actor, action="rollout.release", obj=rollout,
                     environment=locked.environment,
                     summary=f"Released {locked.name} from rollout {rollout.pk}")
    locked.refresh_from_db()
    return locked


def rollout_delete(*, rollout: Rollout, actor) -> None:
    """Delete a finished rollout's history once none of its pins remain."""
    with transaction.atomic():
        locked = _locked(rollout.pk, None)
        if locked.is_active:
            raise Conflict(f"Rollout {locked.pk} is {locked.state}; finish it first.",
                           code="rollout_active")
        pinned = Agent.objects.filter(pin_rollout=locked).count()
        if pinned:
            raise Conflict(f"{pinned} agent(s) are still pinned by rollout {locked.pk}; "
                           "release them first.", code="pins_remain")
        emit("rollout", environment_id=locked.environment_id, id=locked.pk)
        audit_record(actor=actor, action="rollout.delete", obj=locked,
                     environment=locked.environment,
                     summary=f"Deleted rollout {locked.pk} of #{locked.snapshot.number}")
        locked.delete()
