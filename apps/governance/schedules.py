"""Scheduled releases: schedule, cancel, and the steps of a start (apps.releases.
scheduled runs them: starting activates or rolls out, which is above this app).
A start compares and sets: it fails, saying why, when the environment's active
snapshot or the release changed since scheduling. A schedule carries its
scheduler's confirmation of a degenerate render, as the immediate action does."""

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, NotFound, ValidationFailed
from apps.environments.models import Environment
from apps.governance import rules
from apps.governance.models import ReleaseRequest, ScheduledRelease
from apps.governance.services import locked_release
from apps.snapshots.guard import degenerate_findings

MAX_AHEAD = timedelta(days=90)


def _audit(actor, action: Action, schedule: ScheduledRelease, env: Environment, summary: str,
           **data) -> None:
    audit_record(actor=actor, action=action, obj=schedule, environment=env,
                 tenant=env.application.tenant, summary=summary, data=data)


def schedule_create(*, release: ReleaseRequest, run_at: datetime, actor,
                    expected_version: int, confirmed: bool = False) -> ScheduledRelease:
    """Start `release` at `run_at` (within 90 days), if by then neither the
    environment's active snapshot nor the release (at `expected_version`) changed.
    `confirmed`: the scheduler accepts a degenerate render of this content against
    the active snapshot (the immediate action's `confirm`), applied at the start;
    the compare-and-set keeps it to the content checked now (audited, with what the
    guard finds now). An activation of the snapshot already active is refused
    (409 already_active): it would start nothing and leave its release open."""
    now = timezone.now()
    if timezone.is_naive(run_at) or not now < run_at <= now + MAX_AHEAD:
        raise ValidationFailed("run_at: a moment with its offset, in the next 90 days.",
                               details={"field": "run_at"})
    with transaction.atomic():
        env = Environment.objects.lock(release.environment_id)
        locked = locked_release(release.pk, expected_version)
        if locked.state != ReleaseRequest.State.OPEN:
            raise Conflict(f"Release {locked.pk} is {locked.state}.", code="release_closed")
        if locked.plan["kind"] == rules.ACTIVATE and env.active_snapshot_id == locked.snapshot_id:
            raise Conflict(f"#{locked.snapshot.number} is already active in {env.full_name}: "
                           "activating it at a later time would start nothing.",
                           code="already_active", details={"snapshot": locked.snapshot.number})
        schedule = ScheduledRelease.objects.create(
            environment=env, release=locked, run_at=run_at,
            expected_active_snapshot=env.active_snapshot,
            expected_release_version=locked.version, confirmed=confirmed,
            created_by=actor if getattr(actor, "is_authenticated", False) else None)
        active = env.active_snapshot.number if env.active_snapshot else None
        findings = degenerate_findings(env, locked.snapshot.files)
        _audit(actor, Action.SCHEDULE_CREATE, schedule, env,
               f"Release {locked.pk} scheduled at {run_at.isoformat()} (active #{active})"
               + (", its render confirmed" if confirmed else ""),
               run_at=run_at.isoformat(), expected_active=active, version=locked.version,
               confirmed=confirmed, degenerate=findings)
    return schedule


def schedule_lock(schedule_id: int) -> ScheduledRelease | None:
    return locks.lock_first(ScheduledRelease.objects.select_related(
        "release__snapshot", "expected_active_snapshot").filter(pk=schedule_id))


def schedule_cancel(*, schedule: ScheduledRelease, actor) -> ScheduledRelease:
    with transaction.atomic():
        env = Environment.objects.lock(schedule.environment_id)
        locked = schedule_lock(schedule.pk)
        if locked is None:
            raise NotFound(f"Scheduled release {schedule.pk} not found.")
        if locked.state != ScheduledRelease.State.SCHEDULED:
            raise Conflict(f"Scheduled release {locked.pk} is {locked.state}.",
                           code="schedule_finished")
        _finish(locked, ScheduledRelease.State.CANCELLED, "cancelled", "cancelled")
        _audit(actor, Action.SCHEDULE_CANCEL, locked, env,
               f"Cancelled the start of release {locked.release_id} at "
               f"{locked.run_at.isoformat()}")
    return locked


def schedule_refusal(schedule: ScheduledRelease, environment: Environment) -> dict | None:
    """Why the schedule must not start now (its compare-and-set), or None."""
    expected = schedule.expected_active_snapshot
    active = environment.active_snapshot
    return rules.schedule_changed(
        expected_active=expected.number if expected else None,
        active=active.number if active else None,
        expected_version=schedule.expected_release_version,
        version=schedule.release.version, state=schedule.release.state)


def _finish(schedule: ScheduledRelease, state: str, code: str, outcome: str,
            result: dict | None = None) -> None:
    schedule.state, schedule.outcome_code, schedule.outcome = state, code, outcome[:2000]
    schedule.result, schedule.finished_at = result or {}, timezone.now()
    schedule.save(update_fields=["state", "outcome_code", "outcome", "result", "finished_at"])


def schedule_started(*, schedule: ScheduledRelease, environment: Environment,
                     result: dict) -> None:
    """Inside the start's transaction: it started."""
    locks.require_transaction()
    _finish(schedule, ScheduledRelease.State.STARTED, "started", "started", result)
    _audit(schedule.created_by, Action.SCHEDULE_START, schedule, environment,
           f"Scheduled release {schedule.release_id} started", **result)


def schedule_failed(*, schedule_id: int, code: str, message: str, details=None) -> None:
    """In a transaction of its own, after the start was refused: it failed, saying
    why (unless another run finished it first)."""
    with transaction.atomic():
        schedule = ScheduledRelease.objects.filter(pk=schedule_id).first()
        if schedule is None:
            return
        env = Environment.objects.lock(schedule.environment_id)
        locked = schedule_lock(schedule_id)
        if locked.state != ScheduledRelease.State.SCHEDULED:
            return
        _finish(locked, ScheduledRelease.State.FAILED, code, message,
                {"details": details} if details is not None else None)
        _audit(None, Action.SCHEDULE_FAIL, locked, env,
               f"Scheduled release {locked.release_id} did not start: {message}", code=code)


def due_schedule_ids(at: datetime) -> list[int]:
    return list(ScheduledRelease.objects.due(at).order_by("run_at", "pk")
                .values_list("pk", flat=True)[:100])
