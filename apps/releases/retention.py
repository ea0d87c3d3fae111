"""Retention: per-environment bounds on kept snapshots (count and stored bytes) and
finished rollouts. Beat removes the oldest unreferenced snapshots beyond the bounds;
an owner may remove one, with a reason. `snapshot_holds` is the one rule of what is
never removed, and it is only asked under `retention_locks`.

Why the locks make it race-safe (docs/design.md, "Retention"): every change that
makes a snapshot referenced — activation, a push, an operator's or a rollout's pin,
a rollout starting, a publication stored or queued — locks the environment first;
agents' reports (what they applied) lock their agent. Retention locks the
environment and then its agents (the documented lock order), so it sees each of
those either committed or not yet begun, and what it removes stays unreferenced
until it commits. The database refuses any other delete (migration 0008 of
snapshots), and the PROTECT foreign keys refuse a reference it missed.
"""

import logging

from django.db import connection, transaction
from django.db.models import ProtectedError

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.core.events import emit
from apps.environments.models import Environment
from apps.fleet.models import Agent, Deployment
from apps.governance.models import ReleaseRequest
from apps.releases.selectors import over_bounds, retention_usage
from apps.rollouts.models import ACTIVE_STATES, Rollout, RolloutTarget
from apps.rollouts.selectors import rollouts_without_pins
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.rules import retention_excess

logger = logging.getLogger(__name__)

# Why a snapshot is kept, for people (the codes are what the API names).
HOLDS = {
    "active": "it is the environment's active snapshot",
    "desired": "an agent desires it (a push or a manual target)",
    "pinned": "an agent is pinned to it",
    "applied": "an agent last applied it",
    "pushed": "a push of it is pending",
    "rollout": "an unfinished rollout uses it",
    "rollout_history": "a kept finished rollout names it (delete that rollout first)",
    "quarantined": "its content is quarantined (the record of what was rolled back)",
    "rollback_target": "it is the last snapshot a rollback could return to",
    "rendering": "a rollback to it is still rendering",
    "awaiting_confirmation": "its publication waits for a confirmation",
    "release": "a release (governance) names it: the record of what was approved",
}
ROLLOUT_SNAPSHOTS = ("snapshot_id", "previous_snapshot_id", "rollback_snapshot_id")


def retention_locks(environment_id: int) -> Environment:
    """Lock the environment, then its agents (primary-key order): nothing can make
    one of its snapshots referenced until the caller's transaction ends."""
    environment = Environment.objects.lock(environment_id)
    locks.lock_all(Agent.objects.filter(environment=environment).only("pk"))
    return environment


def _rollout_refs(rollouts) -> set:
    refs = {pk for row in rollouts.values_list(*ROLLOUT_SNAPSHOTS) for pk in row}
    refs |= set(RolloutTarget.objects.filter(rollout__in=rollouts)
                .values_list("previous_snapshot_id", flat=True))
    return refs


def _rollback_target(environment: Environment):
    """The newest ready, unquarantined snapshot older than the active one."""
    active = environment.active_snapshot
    if active is None:
        return None
    return (Snapshot.objects.filter(environment=environment, state=Snapshot.State.READY,
                                    number__lt=active.number)
            .unquarantined().order_by("-number").values_list("pk", flat=True).first())


def snapshot_holds(environment: Environment, snapshot_ids) -> dict[int, list[str]]:
    """THE rule of what retention never removes: for each of `snapshot_ids` (of the
    environment), the HOLDS codes that keep it; an empty list means it may go.
    Runs under retention_locks, so the answer holds until the transaction ends."""
    locks.require_transaction()
    ids = set(snapshot_ids)
    holds = {pk: [] for pk in ids}
    agents = Agent.objects.filter(environment=environment)
    applied = set(agents.exclude(applied_number=None)
                  .values_list("applied_number", flat=True))
    rollouts = Rollout.objects.filter(environment=environment)
    mine = Snapshot.objects.filter(environment=environment)
    publications = Publication.objects.filter(environment=environment)
    for code, refs in (
        ("active", {environment.active_snapshot_id}),
        ("desired", set(agents.values_list("target_snapshot_id", flat=True))),
        ("pinned", set(agents.values_list("pinned_snapshot_id", flat=True))),
        ("applied", set(mine.filter(number__in=applied).values_list("pk", flat=True))),
        ("pushed", set(Deployment.objects.filter(agent__environment=environment,
                                                 state=Deployment.State.PENDING)
                       .values_list("snapshot_id", flat=True))),
        ("rollout", _rollout_refs(rollouts.filter(state__in=ACTIVE_STATES))),
        ("rollout_history", _rollout_refs(rollouts.exclude(state__in=ACTIVE_STATES))),
        ("quarantined", set(mine.quarantined().values_list("pk", flat=True))),
        ("rollback_target", {_rollback_target(environment)}),
        ("rendering", set(publications.filter(state=Publication.State.RENDERING)
                          .values_list("rolled_back_from_id", flat=True))),
        ("release", set(ReleaseRequest.objects.filter(environment=environment)
                        .values_list("snapshot_id", flat=True))),
        ("awaiting_confirmation", set(publications.filter(
            needs_confirmation__isnull=False, activated=False,
            state=Publication.State.READY).values_list("snapshot_id", flat=True))),
    ):
        for pk in refs & ids:
            holds[pk].append(code)
    return holds


def _allow_removal(snapshot_ids: list[int]) -> None:
    """Name the rows this transaction may delete: the database refuses any other
    delete of a snapshot (PostgreSQL; migration 0008 of snapshots)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT set_config('bellwether.snapshot_removal', %s, true)",
                           [",".join(str(pk) for pk in snapshot_ids)])


def _remove(environment: Environment, snapshots: list[Snapshot], *, actor,
            reason: str) -> None:
    """Delete `snapshots` (unheld, under retention_locks) with the history that is
    theirs alone: finished deployments of them, the publications that produced them
    (and those publications' descriptor records). Audit events stay."""
    ids = [s.pk for s in snapshots]
    _allow_removal(ids)
    for snapshot in snapshots:
        audit_record(actor=actor, action=Action.SNAPSHOT_REMOVE, obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Removed #{snapshot.number} of {environment.full_name}: {reason}",
                     data={"number": snapshot.number, "checksum": snapshot.checksum,
                           "bytes": getattr(snapshot, "stored_bytes", None),
                           "reason": reason})
    Deployment.objects.filter(snapshot_id__in=ids).exclude(
        state=Deployment.State.PENDING).delete()
    try:
        Snapshot.objects.filter(pk__in=ids).delete()
    except ProtectedError as error:  # a reference the rule did not know: keep it all
        raise Conflict(f"A snapshot of {environment.full_name} is still referenced; "
                       "nothing was removed.", code="snapshot_kept") from error
    emit("snapshot", environment_id=environment.pk, number=None)
    logger.info("%s: removed %s (%s)", environment.full_name,
                ", ".join(f"#{s.number}" for s in snapshots), reason)


def _refuse_held(snapshot: Snapshot, codes: list[str]) -> None:
    if codes:
        raise Conflict(f"#{snapshot.number} is kept: " + "; ".join(HOLDS[c] for c in codes)
                       + ".", code="snapshot_kept",
                       details=[{"reason": c, "message": HOLDS[c]} for c in codes])


def snapshot_remove(*, snapshot: Snapshot, actor, reason: str) -> None:
    """An owner removes one snapshot, with a reason (400 without one); 409
    snapshot_kept naming every hold when the rule keeps it."""
    reason = (reason or "").strip()
    if not reason:
        raise ValidationFailed("Removing a snapshot needs a reason.", code="reason_required",
                               details=[{"field": "reason", "message": "required"}])
    with transaction.atomic():
        environment = retention_locks(snapshot.environment_id)
        current = (Snapshot.objects.filter(pk=snapshot.pk, environment=environment)
                   .with_stored_bytes().first())
        if current is None:
            raise NotFound(f"Snapshot {snapshot.number} of {environment.full_name} not found.")
        _refuse_held(current, snapshot_holds(environment, [current.pk])[current.pk])
        _remove(environment, [current], actor=actor, reason=reason)


def _rollout_history_trim(environment: Environment) -> int:
    """Delete the oldest finished rollouts beyond the environment's bound that hold
    no pins (a kept pin keeps its rollout). Their audit events stay."""
    finished = Rollout.objects.filter(environment=environment).exclude(state__in=ACTIVE_STATES)
    excess = finished.count() - environment.retention_rollouts
    if excess <= 0:
        return 0
    old = list(rollouts_without_pins(finished).select_related("snapshot")
               .order_by("pk")[:excess])
    for rollout in old:
        audit_record(actor=None, action=Action.ROLLOUT_DELETE, obj=rollout,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Retention removed finished rollout {rollout.pk} of "
                             f"#{rollout.snapshot.number}: {environment.full_name} keeps "
                             f"{environment.retention_rollouts} finished rollouts")
    Rollout.objects.filter(pk__in=[r.pk for r in old]).delete()
    return len(old)


def environment_retention_apply(*, environment_id: int) -> dict:
    """Bring one environment within its bounds: finished rollouts first (what they
    name may then go), then the oldest snapshots nothing holds. Returns what went."""
    with transaction.atomic():
        environment = retention_locks(environment_id)
        rollouts = _rollout_history_trim(environment)
        stored = list(Snapshot.objects.filter(environment=environment).with_stored_bytes()
                      .order_by("number").values_list("pk", "stored_bytes"))
        holds = snapshot_holds(environment, [pk for pk, _ in stored])
        excess = retention_excess(stored=stored, kept={pk for pk, h in holds.items() if h},
                                  max_count=environment.retention_snapshots,
                                  max_bytes=environment.retention_bytes)
        if excess:
            _remove(environment, list(Snapshot.objects.filter(pk__in=excess)
                                      .with_stored_bytes().order_by("number")),
                    actor=None, reason=f"retention: {environment.full_name} keeps at most "
                                       f"{environment.retention_snapshots} snapshots and "
                                       f"{environment.retention_bytes} bytes")
    return {"snapshots": len(excess), "rollouts": rollouts}


def retention_sweep() -> dict:
    """Beat: every environment over a bound brought within it, each in its own
    transaction (one environment's failure does not stop the others)."""
    removed = {"snapshots": 0, "rollouts": 0}
    for environment in Environment.objects.select_related("application").order_by("pk"):
        if not over_bounds(retention_usage(environment)):
            continue
        try:
            went = environment_retention_apply(environment_id=environment.pk)
        except Conflict:
            logger.exception("retention of %s failed", environment.full_name)
            continue
        removed = {k: removed[k] + went[k] for k in removed}
    return removed
