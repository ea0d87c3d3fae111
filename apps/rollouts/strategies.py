"""Named rollout strategies (docs/rollouts.md, "Strategies"): a tenant's owners
create and delete their own, built-in ones are read-only, and an environment's
owners choose the one its rollouts start from when they name none. Every change is
audited in its transaction; definitions are checked by strategy_rules."""

from django.db import IntegrityError, transaction
from django.db.models import Q

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, PermissionDenied, ValidationFailed
from apps.environments.models import Environment
from apps.rollouts.models import EnvironmentStrategy, RolloutStrategy
from apps.rollouts.strategy_rules import rollout_options, strategy_problems
from apps.tenancy.models import Tenant, slug_validator


def _refuse(problems: list[dict], prefix: str = "") -> None:
    problems = [{**p, "field": prefix + p["field"]} for p in problems]
    first = problems[0]
    raise ValidationFailed(f"{first['field']}: {first['message']}", details=problems[:50])


def _check_name(name: str) -> None:
    try:
        slug_validator(name)
    except Exception:  # noqa: BLE001 - Django's ValidationError, as a domain refusal
        _refuse([{"field": "name", "message": slug_validator.message}])


def strategy_create(*, tenant: Tenant, name: str, definition, actor,
                    description: str = "") -> RolloutStrategy:
    """A strategy of `tenant`'s own. 400 naming the field of a bad definition;
    409 when the tenant has one by that name or a built-in one is called so."""
    _check_name(name)
    problems = strategy_problems(definition)
    if problems:
        _refuse(problems, "definition.")
    if RolloutStrategy.objects.filter(tenant__isnull=True, name=name).exists():
        raise Conflict(f"{name} is a built-in strategy's name.", code="strategy_exists",
                       details=[{"field": "name"}])
    try:
        with transaction.atomic():
            strategy = RolloutStrategy.objects.create(
                tenant=tenant, name=name, description=description, definition=definition,
                created_by=actor if getattr(actor, "is_authenticated", False) else None)
            audit_record(actor=actor, action=Action.STRATEGY_CREATE, obj=strategy,
                         tenant=tenant, summary=f"Rollout strategy {name} created",
                         data={"definition": definition})
    except IntegrityError:
        raise Conflict(f"{tenant.name} already has a strategy named {name}.",
                       code="strategy_exists", details=[{"field": "name"}]) from None
    return strategy


def strategy_delete(*, strategy: RolloutStrategy, actor) -> None:
    """Delete a tenant's strategy; built-in ones are read-only (403), one that is an
    environment's default stays until that default is changed (409)."""
    if strategy.is_builtin:
        raise PermissionDenied(f"{strategy.name} is built in and read-only.",
                               code="read_only")
    with transaction.atomic():
        locked = locks.lock_one(RolloutStrategy.objects, pk=strategy.pk)
        defaults = list(EnvironmentStrategy.objects.filter(strategy=locked)
                        .values_list("environment_id", flat=True)[:20])
        if defaults:
            raise Conflict(f"{locked.name} is the default strategy of {len(defaults)} "
                           "environment(s); choose another default there first.",
                           code="strategy_in_use", details=[{"environments": defaults}])
        audit_record(actor=actor, action=Action.STRATEGY_DELETE, obj=locked,
                     tenant=locked.tenant, summary=f"Rollout strategy {locked.name} deleted")
        locked.delete()


def environment_strategy_set(*, environment: Environment, strategy: RolloutStrategy | None,
                             actor) -> EnvironmentStrategy | None:
    """Make `strategy` (built-in, or of the environment's tenant) the environment's
    default; None clears it."""
    if strategy is not None and strategy.tenant_id not in (
            None, environment.application.tenant_id):
        raise ValidationFailed("strategy: not a strategy of this environment's tenant.",
                               details=[{"field": "strategy"}])
    with transaction.atomic():
        env = Environment.objects.lock(environment.pk)
        current = EnvironmentStrategy.objects.filter(environment=env).first()
        if strategy is None:
            if current is not None:
                current.delete()
            chosen = None
        else:
            chosen, _ = EnvironmentStrategy.objects.update_or_create(
                environment=env, defaults={"strategy": strategy, "set_by": (
                    actor if getattr(actor, "is_authenticated", False) else None)})
        audit_record(actor=actor, action=Action.STRATEGY_DEFAULT, obj=env, environment=env,
                     summary=f"Default rollout strategy of {env.full_name}: "
                             + (strategy.name if strategy else "none"),
                     data={"strategy": strategy.name if strategy else None})
    return chosen


def strategy_named(environment: Environment, name: str) -> RolloutStrategy:
    """The strategy `name` the environment may use (its tenant's, else a built-in
    one); 400 naming the field when there is none."""
    found = (RolloutStrategy.objects.filter(name=name, tenant_id__in=[
        environment.application.tenant_id]).first()
        or RolloutStrategy.objects.filter(name=name, tenant__isnull=True).first())
    if found is None:
        known = sorted(set(strategies_for(environment).values_list("name", flat=True)))
        raise ValidationFailed(
            f"strategy: no strategy named {name!r}; {environment.full_name} may use "
            f"{', '.join(known) or 'none'}.", code="unknown_strategy",
            details=[{"field": "strategy", "message": f"no strategy named {name!r}",
                      "choices": known}])
    return found


def default_strategy(environment: Environment) -> RolloutStrategy | None:
    chosen = (EnvironmentStrategy.objects.filter(environment=environment)
              .select_related("strategy").first())
    return chosen.strategy if chosen else None


def rollout_options_for(environment: Environment, strategy_name: str | None,
                        given: dict) -> tuple[RolloutStrategy | None, dict]:
    """(strategy, options) of a new rollout: the strategy named, else the
    environment's default, else none; the fields `given` set override it."""
    strategy = (strategy_named(environment, strategy_name) if strategy_name
                else default_strategy(environment))
    return strategy, rollout_options(strategy.definition if strategy else None, given)


def strategies_for(environment: Environment):
    """The strategies an environment's rollouts may name: built-in and its tenant's."""
    return RolloutStrategy.objects.filter(
        Q(tenant__isnull=True) | Q(tenant_id=environment.application.tenant_id)
    ).select_related("tenant")
