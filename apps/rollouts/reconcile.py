"""Reconcile: the automatic driver of active rollouts. It advances an acknowledged,
baked wave behind an automatic gate, pauses a wave that timed out, and rolls a
rollout back when more targets failed than it tolerates. Run by a worker after a
report (apps.releases) and by beat for every active rollout.
"""

import functools
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core.errors import Conflict
from apps.core.events import emit
from apps.environments.models import Environment
from apps.governance.rules import describe_hold
from apps.governance.selectors import freeze_in_force
from apps.rollouts import inflight, rules, selectors
from apps.rollouts.models import Rollout
from apps.rollouts.services import advance, locked_rollout, rollout_rollback, transition


def rollout_reconcile(*, rollout_id: int) -> str:
    """Drive an active rollout by its automatic rules. Idempotent and safe to run
    concurrently: it works under the rollout's row lock. Returns what it did."""
    with transaction.atomic():
        rollout = Rollout.objects.filter(pk=rollout_id).only("environment_id").first()
        if rollout is None:
            return "idle"
        Environment.objects.lock(rollout.environment_id)
        rollout = locked_rollout(rollout_id, None)
        if not rollout.is_active:
            return "idle"
        failed = selectors.failures(rollout)
        if failed <= rollout.failure_threshold:
            # A paused rollout waits for an operator, but still rolls back on failures.
            return _drive(rollout) if rollout.state == Rollout.State.RUNNING else "idle"
        version = rollout.version
        first = next(iter(selectors.failure_reports(rollout, shown=1)), None)
    # Outside the lock: a rollback re-renders a snapshot and takes the locks itself.
    try:
        rollout_rollback(rollout=rollout, expected_version=version, actor=None,
                         reason=rules.failure_reason(rollout.failure_threshold, failed, first))
    except Conflict as exc:  # an operator (or another reconcile) acted first
        return f"skipped: {exc.code}"
    return "rolled_back"


def _drive(rollout: Rollout) -> str:
    """Advance an acknowledged, baked wave behind an automatic gate, or pause a wave
    that timed out. Called with the rollout locked."""
    hold = functools.cache(lambda: freeze_in_force(rollout.environment_id))  # read once
    limited = _wave_limits(rollout, hold)
    if limited:
        return limited
    wave = rollout.waves[rollout.current_wave]
    evidence = selectors.wave_evidence(rollout)
    waited = timezone.now() - rollout.wave_started_at
    baked = waited >= timedelta(seconds=wave.get("bake_s", 0))
    if evidence.settled and wave.get("gate") == Rollout.Gate.AUTO and baked:
        if hold() is not None:
            return _held(rollout, hold())
        advance(rollout, None, "acknowledged and baked", evidence)
        return "advanced"
    if waited > timedelta(seconds=rollout.wave_timeout_s):
        blockers = rules.describe(
            evidence.blockers(order=("waiting", "changed", "released", "failed")))
        reason = (f"{rules.wave_name(rollout.current_wave)} not acknowledged within "
                  f"{rollout.wave_timeout_s}s ({blockers or 'waiting for a gate'})")
        transition(rollout, None, Action.ROLLOUT_PAUSE,
                    f"Rollout {rollout.pk} paused: {reason}",
                    state=Rollout.State.PAUSED, reason=reason)
        return "paused"
    return "waiting"


def _wave_limits(rollout: Rollout, hold) -> str | None:
    """A wave's own limits (apps.rollouts.inflight): stop it (pause) at its
    max_failures, else top it up to max_in_flight unless `hold()` names a freeze.
    None when neither acted."""
    reason = inflight.wave_stop_reason(rollout)
    if reason:
        transition(rollout, None, Action.ROLLOUT_PAUSE,
                   f"Rollout {rollout.pk} paused: {reason}",
                   state=Rollout.State.PAUSED, reason=reason)
        return "stopped"
    limited = rollout.waves[rollout.current_wave].get("max_in_flight")
    if not limited or hold() is not None:
        return None  # no more agents get it during a freeze; _drive says why
    return "topped_up" if inflight.wave_top_up(rollout) else None


def _held(rollout: Rollout, hold: dict) -> str:
    """A freeze holds the wave advance: the rollout waits, saying why in its `reason`
    (its version unchanged: an operator's confirm or rollback still applies), and the
    hold is audited once when it begins or changes."""
    reason = f"waiting: {describe_hold(hold)}"
    if rollout.reason != reason:
        rollout.reason = reason
        rollout.save(update_fields=["reason"])
        emit("rollout", environment_id=rollout.environment_id, id=rollout.pk)
        audit_record(actor=None, action=Action.ROLLOUT_HELD, obj=rollout,
                     environment=rollout.environment,
                     summary=f"Rollout {rollout.pk} {reason}", data=hold)
    return "frozen"


def rollouts_reconcile() -> dict:
    """Reconcile every running rollout (the beat task and embedded loop call this)."""
    return {rollout_id: rollout_reconcile(rollout_id=rollout_id)
            for rollout_id in Rollout.objects.active().values_list("pk", flat=True)}
