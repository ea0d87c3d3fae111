"""Bounds on what rollouts may fill, each counted within one tenant or environment so
that no tenant's rollouts can refuse another's: active rollouts per tenant, finished
rollouts kept per environment (the oldest pruned as new ones start)."""

from django.conf import settings

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core.errors import Conflict
from apps.environments.models import Environment
from apps.rollouts import selectors
from apps.rollouts.models import ACTIVE_STATES, Rollout
from apps.tenancy.models import Tenant


def refuse_too_many_active(tenant: Tenant) -> None:
    """Refuse a new rollout when `tenant` (locked) already runs max_active of them."""
    bound = settings.BELLWETHER_ROLLOUT_LIMITS["max_active"]
    active = Rollout.objects.active().filter(environment__application__tenant=tenant)
    if active.count() >= bound:
        raise Conflict(f"{tenant.name} already has {bound} active rollouts, the most a "
                       "tenant may run at once (BELLWETHER_ROLLOUT_MAX_ACTIVE); finish or "
                       "roll one back first.", code="too_many_rollouts",
                       details=[{"bound": "BELLWETHER_ROLLOUT_MAX_ACTIVE", "value": bound}])


def history_prune(env: Environment, actor) -> None:
    """Keep at most max_history - 1 finished rollouts of the (locked) environment, so
    the new one fits: the oldest that hold no pins go; their audit events stay. When
    pins hold every one of them, refuse, naming what frees the history."""
    bound = settings.BELLWETHER_ROLLOUT_LIMITS["max_history"]
    finished = Rollout.objects.filter(environment=env).exclude(state__in=ACTIVE_STATES)
    excess = finished.count() - (bound - 1)
    if excess <= 0:
        return
    prunable = list(selectors.rollouts_without_pins(finished).select_related("snapshot")
                    .order_by("pk")[:excess])
    if len(prunable) < excess:
        held = list(finished.exclude(pk__in=[r.pk for r in prunable])
                    .order_by("pk").values_list("pk", flat=True)[:20])
        raise Conflict(f"{env.full_name} keeps at most {bound} finished rollouts "
                       "(BELLWETHER_ROLLOUT_MAX_HISTORY) and agents are still held by the "
                       "ones it would prune; release their pins (POST /api/v1/rollouts/"
                       "<id>/release-pins) to free the history.", code="history_full",
                       details=[{"bound": "BELLWETHER_ROLLOUT_MAX_HISTORY", "value": bound,
                                 "rollouts_holding_pins": held}])
    for old in prunable:
        audit_record(actor=actor, action=Action.ROLLOUT_DELETE, obj=old, environment=env,
                     summary=f"Pruned finished rollout {old.pk} of #{old.snapshot.number}: "
                             f"{env.full_name} keeps {bound} finished rollouts")
    Rollout.objects.filter(pk__in=[old.pk for old in prunable]).delete()
