"""Reads about rollouts: acknowledgement evidence for a wave, freshness, listing, and
the summary a finished rollout keeps."""

from datetime import timedelta

from django.db.models import Count, Exists, Max, OuterRef, Q, Subquery
from django.utils import timezone

from apps.core.bulk import Epoch
from apps.core.errors import NotFound, PermissionDenied
from apps.fleet.models import Deployment
from apps.fleet.selectors import last_seen_seconds_of
from apps.rollouts.models import Rollout, RolloutStrategy, RolloutTarget
from apps.rollouts.rules import WaveEvidence
from apps.tenancy.models import Membership, Role, Tenant

FRESHNESS_INTERVALS = 3
FRESHNESS_MIN = timedelta(seconds=180)
FRESHNESS_MAX = timedelta(hours=1)


def freshness_window(rollout: Rollout) -> timedelta:
    """How recent an acknowledgement must be: 3 poll intervals, 180 s to 1 h."""
    interval = timedelta(seconds=rollout.environment.poll_interval_s)
    return min(FRESHNESS_MAX, max(FRESHNESS_MIN, FRESHNESS_INTERVALS * interval))


def wave_evidence(rollout: Rollout, wave: int | None = None) -> WaveEvidence:
    """Who in `wave` (the current one by default) has reported success for the exact
    snapshot number and checksum, strictly after activation and within the freshness
    window (docs/rollouts.md). Decommissioned agents are listed apart: they neither
    block nor acknowledge."""
    wave = rollout.current_wave if wave is None else wave
    return waves_evidence(rollout, [wave])[wave]


# What the evidence reads of a target and its agent: a wave of thousands of targets
# loads as that many tuples (no model instances; not the agents' labels, drift or
# messages), its times as seconds since the epoch (apps.core.bulk.Epoch: they are
# only compared).
EVIDENCE_FIELDS = ("agent_id", "wave", "state", "generation", "agent__name",
                   "agent__generation", "agent__applied_number", "agent__applied_checksum")
EVIDENCE_TIMES = {"activated_s": Epoch("activated_at"),
                  "decommissioned_s": Epoch("agent__decommissioned_at"),
                  "last_seen_s": Epoch("agent__last_seen_at")}


def waves_evidence(rollout: Rollout, waves) -> dict[int, WaveEvidence]:
    """wave_evidence of each of `waves`, in one pass: two queries and one read of the
    heartbeats, however many targets and waves."""
    targets = list(RolloutTarget.objects.filter(rollout=rollout, wave__in=list(waves))
                   .order_by("agent__name").annotate(**EVIDENCE_TIMES)
                   .values_list(*EVIDENCE_FIELDS, *EVIDENCE_TIMES, named=True))
    # The reports of exactly this snapshot, per agent: a report of any other snapshot
    # must not make an old acknowledgement look new. (The ids as a list, not a
    # subquery: PostgreSQL plans `= ANY` well even before it has statistics.)
    reports = {
        row["agent_id"]: row for row in Deployment.objects.filter(
            agent_id__among=[t.agent_id for t in targets], snapshot=rollout.snapshot,
            reported_at__isnull=False,
        ).values("agent_id").annotate(
            succeeded=Epoch(Max("reported_at", filter=Q(state=Deployment.State.SUCCEEDED))),
            failed=Epoch(Max("reported_at", filter=Q(state__in=[Deployment.State.WARNING,
                                                                Deployment.State.FAILED]))),
        )
    }
    # An agent reports once per apply, then keeps polling: its acknowledgement stays
    # fresh while it polls (heartbeat) with that snapshot still applied.
    seen = last_seen_seconds_of({t.agent_id: t.last_seen_s for t in targets})
    fresh_after = (timezone.now() - freshness_window(rollout)).timestamp()
    applied = (rollout.snapshot.number, rollout.snapshot.checksum)
    evidence = {wave: WaveEvidence() for wave in waves}
    for target in targets:
        kind = _evidence_kind(target, reports.get(target.agent_id, {}), applied,
                              seen.get(target.agent_id), fresh_after)
        getattr(evidence[target.wave], kind).append(target.agent__name)
    return evidence


def _evidence_kind(target, report: dict, applied: tuple, seen, fresh_after) -> str:
    """What one target (a row of EVIDENCE_FIELDS and EVIDENCE_TIMES) has shown: the
    name of its WaveEvidence list. `applied` is the rollout snapshot's (number,
    checksum); times are seconds since the epoch."""
    succeeded, failed = report.get("succeeded"), report.get("failed")
    if target.decommissioned_s is not None:
        return "decommissioned"
    if target.state == RolloutTarget.State.RELEASED:
        return "released"
    if target.state != RolloutTarget.State.ACTIVATED:
        return "waiting"
    if target.agent__generation != target.generation:
        return "changed"
    if failed is not None and failed > target.activated_s and (
            succeeded is None or failed > succeeded):
        return "failed"
    if (succeeded is not None and succeeded > target.activated_s
            and (target.agent__applied_number, target.agent__applied_checksum) == applied
            and max(succeeded, seen or succeeded) >= fresh_after):
        return "acknowledged"
    return "waiting"


def _failed_reports(rollout: Rollout):
    """The reports of a failure of the rollout's snapshot, by the agent of the outer
    target, after its activation (latest first)."""
    return Deployment.objects.filter(
        agent_id=OuterRef("agent_id"), snapshot=rollout.snapshot,
        state__in=[Deployment.State.WARNING, Deployment.State.FAILED],
        reported_at__gt=OuterRef("activated_at"),
    ).order_by("-reported_at")


def failures(rollout: Rollout) -> int:
    """Activated targets that reported a failure of this snapshot after activation
    (one counting query, however many targets)."""
    return RolloutTarget.objects.filter(rollout=rollout, state=RolloutTarget.State.ACTIVATED
                                        ).filter(Exists(_failed_reports(rollout))).count()


def failure_reports(rollout: Rollout, shown: int = 100) -> list[dict]:
    """What the failed targets' agents said, by agent name (at most `shown`; one
    query): {agent, status (failed or warning), message}, their latest report of
    the rollout's snapshot since activation."""
    latest = _failed_reports(rollout)
    rows = (RolloutTarget.objects.filter(rollout=rollout, state=RolloutTarget.State.ACTIVATED)
            .annotate(status=Subquery(latest.values("state")[:1]),
                      message=Subquery(latest.values("message")[:1]))
            .filter(status__isnull=False).order_by("agent__name")
            .values("agent__name", "status", "message")[:shown])
    return [{"agent": row["agent__name"], "status": row["status"], "message": row["message"]}
            for row in rows]


def _holding_targets(rollout):
    """The targets of `rollout` (a Rollout or an OuterRef to one) whose agents its
    pins still hold: found through the targets, indexed by rollout (the agents'
    pin column is not indexed: apps.fleet.models), as only a target is pinned."""
    return RolloutTarget.objects.filter(rollout=rollout, agent__pin_rollout=rollout)


def pins_held(rollout: Rollout) -> int:
    """How many agents the rollout's pins still hold."""
    return _holding_targets(rollout).count()


def rollouts_without_pins(rollouts):
    """Those of `rollouts` that hold no agent's pin (their history may go)."""
    return rollouts.exclude(Exists(_holding_targets(OuterRef("pk"))))


EVIDENCE_KINDS = ("acknowledged", "failed", "waiting", "released", "changed")


def rollout_summary(rollout: Rollout, shown: int = 100,
                    known: dict[int, WaveEvidence] | None = None) -> dict:
    """What a rollout showed when it finished, kept on it before its pins go: per
    wave {index, targets, activated (ever), acknowledged, failed}, the current
    wave's evidence by name and what the failed agents said (at most `shown` each).
    `known`: the evidence of waves already read in this transaction (the confirm
    that completes it), not read again."""
    rows = {row["wave"]: row for row in RolloutTarget.objects.filter(rollout=rollout)
            .values("wave").annotate(targets=Count("pk"),
                                     activated=Count("pk", filter=Q(activated_at__isnull=False)))}
    known = known or {}
    reached = {**waves_evidence(rollout, [w for w in range(rollout.current_wave + 1)
                                          if w not in known]), **known}
    waves = []
    for index in range(len(rollout.waves)):
        evidence = reached.get(index, WaveEvidence())
        row = rows.get(index, {})
        waves.append({"index": index, "targets": row.get("targets", 0),
                      "activated": row.get("activated", 0),
                      "acknowledged": len(evidence.acknowledged),
                      "failed": len(evidence.failed)})
    final = reached[rollout.current_wave]
    return {"waves": waves, "final_evidence": {k: getattr(final, k)[:shown]
                                               for k in EVIDENCE_KINDS},
            "failures": failure_reports(rollout, shown)}


def wave_progress(rollouts) -> dict:
    """rollout id -> wave -> {targets, activated, released} in one query."""
    rows = (RolloutTarget.objects.filter(rollout__in=rollouts).values("rollout_id", "wave")
            .annotate(targets=Count("pk"),
                      activated=Count("pk", filter=Q(state=RolloutTarget.State.ACTIVATED)),
                      released=Count("pk", filter=Q(state=RolloutTarget.State.RELEASED))))
    progress: dict = {}
    for row in rows:
        progress.setdefault(row["rollout_id"], {})[row["wave"]] = {
            k: row[k] for k in ("targets", "activated", "released")}
    return progress


def strategies_visible_to(user):
    """The built-in strategies and those of the tenants `user` belongs to."""
    if not user.is_authenticated or not user.is_active:
        return RolloutStrategy.objects.none()
    strategies = RolloutStrategy.objects.select_related("tenant")
    if user.is_superuser:
        return strategies
    return strategies.filter(Q(tenant__isnull=True) | Q(tenant__memberships__user=user))


def tenant_owned(user, slug: str) -> Tenant:
    """The tenant `slug` if `user` owns it: 404 when they are no member, 403 when
    they are one but not its owner."""
    tenant = Tenant.objects.filter(slug=slug).first()
    role = (None if tenant is None or user.is_superuser else Membership.objects.filter(
        tenant=tenant, user=user).values_list("role", flat=True).first())
    if tenant is None or (role is None and not user.is_superuser):
        raise NotFound(f"Tenant {slug} not found.", details=[{"field": "tenant"}])
    if role is not None and role != Role.OWNER:
        raise PermissionDenied(f"This needs the owner role in {tenant.name}.")
    return tenant
