"""Row locks: every `select_for_update` of the project goes through this module.

The lock order, which every writer follows so that two writers never wait on each
other in a cycle:

    environment → publication → rollout → agents (primary-key order) → deployments

(A publication created in the same transaction, as a rollout's rollback does,
is locked after the rollout: no other writer can see it yet.) Creating a rollout
locks its tenant before the environment (the tenant-wide bound on active
rollouts); no writer locks a tenant while it holds an environment. Tokens,
memberships, applications and policies are locked alone. Locks
hold until the outermost transaction ends, so each helper insists on running
inside one; outer services open it with `transaction.atomic()`.
"""

from django.db import transaction
from django.db.models import Model, QuerySet


def require_transaction() -> None:
    """Refuse to run outside `transaction.atomic()`: a lock taken there would end
    with the statement, and the caller's check-then-write would race."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("row locks are taken inside transaction.atomic()")


def lock_one(queryset: QuerySet, **lookup) -> Model:
    """The one row matching `lookup`, locked (only its own table's row, never the
    rows `select_related` joins in). DoesNotExist as `get` raises it."""
    require_transaction()
    return queryset.select_for_update(of=("self",)).get(**lookup)


def lock_first(queryset: QuerySet) -> Model | None:
    """The first row of `queryset`, locked, or None."""
    require_transaction()
    return queryset.select_for_update(of=("self",)).first()


def lock_all(queryset: QuerySet) -> list:
    """Every row of `queryset`, locked in primary-key order."""
    require_transaction()
    return list(queryset.select_for_update(of=("self",)).order_by("pk"))
