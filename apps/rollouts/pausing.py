"""An operator's pause and resume of a rollout. A paused rollout stays where it is:
the reconciler neither advances it nor pauses it again, but it still rolls it back
when more targets fail than it tolerates; a confirm of its wave resumes it too.
Resuming restarts the wave's clock, so a wave that timed out gets its full wave
timeout (and bake time) again instead of pausing at once."""

import logging

from django.db import transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.core.errors import Conflict
from apps.environments.models import Environment
from apps.rollouts import rules
from apps.rollouts.models import Rollout
from apps.rollouts.services import locked_rollout, transition

logger = logging.getLogger(__name__)


def _locked(rollout: Rollout, expected_version: int, state: str, verb: str) -> Rollout:
    """The rollout locked at `expected_version`, refused unless it is in `state`."""
    Environment.objects.lock(rollout.environment_id)
    locked = locked_rollout(rollout.pk, expected_version)
    if locked.state != state:
        code = "rollout_finished" if not locked.is_active else f"rollout_{locked.state}"
        raise Conflict(f"Rollout {locked.pk} is {locked.state}; only a {state} rollout can "
                       f"be {verb}.", code=code)
    return locked


def rollout_pause(*, rollout: Rollout, expected_version: int, actor, reason: str = "") -> Rollout:
    """Pause a running rollout at the version the operator saw (CAS)."""
    with transaction.atomic():
        locked = _locked(rollout, expected_version, Rollout.State.RUNNING, "paused")
        who = actor.get_username() if getattr(actor, "is_authenticated", False) else "system"
        why = reason or f"paused by {who}"
        transition(locked, actor, Action.ROLLOUT_PAUSE, f"Rollout {locked.pk} paused: {why}",
                   state=Rollout.State.PAUSED, reason=why)
    logger.info("rollout %s paused: %s", locked.pk, why)
    return locked


def rollout_resume(*, rollout: Rollout, expected_version: int, actor) -> Rollout:
    """Resume a paused rollout at the version the operator saw (CAS): its current
    wave's clock starts again now."""
    with transaction.atomic():
        locked = _locked(rollout, expected_version, Rollout.State.PAUSED, "resumed")
        transition(locked, actor, Action.ROLLOUT_RESUME,
                   f"Rollout {locked.pk} resumed at "
                   f"{rules.wave_name(locked.current_wave, len(locked.waves))}",
                   state=Rollout.State.RUNNING, reason="", wave_started_at=timezone.now())
    logger.info("rollout %s resumed", locked.pk)
    return locked
