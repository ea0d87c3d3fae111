"""Scheduled releases started at their time (beat, every 10 s; in embedded mode the
same schedule runs in-process, project/embedded.py). A start compares and sets in
one transaction: the environment's active snapshot and the release as they were
when it was scheduled, then the release's own path (activation, push or rollout,
with every gate those pass). Any refusal fails it, saying why; newer work is never
overwritten. Its task lives here (listed in CELERY_IMPORTS): apps.releases.tasks
is imported by the services this module calls."""

import logging

from celery import shared_task
from django.db import transaction
from django.utils import timezone

from apps.core import locks
from apps.core.errors import ApplicationError, Conflict
from apps.environments.models import Environment
from apps.fleet.models import Agent
from apps.governance import rules, schedules
from apps.governance.models import ReleaseRequest, ScheduledRelease
from apps.releases.services import snapshot_activate, snapshot_deploy
from apps.rollouts.services import rollout_create
from apps.tenancy.models import Tenant

logger = logging.getLogger(__name__)


def _start(release: ReleaseRequest, actor, confirmed: bool) -> dict:
    """Run the release's plan through the path a person would take, with the
    scheduler's confirmation of a degenerate render (`confirmed`)."""
    plan, snapshot = release.plan, release.snapshot
    if plan["kind"] == rules.ACTIVATE:
        snapshot_activate(snapshot=snapshot, actor=actor, confirmed=confirmed)
        return {"activated": snapshot.number}
    if plan["kind"] == rules.PUSH:
        agents = None if plan["agents"] == "all" else plan["agents"]
        return {"pushed": len(snapshot_deploy(snapshot=snapshot, agent_ids=agents,
                                              actor=actor, confirmed=confirmed))}
    targets = None
    if plan["targets"] != "all":
        generations = dict(Agent.objects.filter(environment=release.environment,
                                                pk__in=plan["targets"])
                           .values_list("pk", "generation"))
        targets = [{"agent": pk, "expected_generation": generations.get(pk, 0)}
                   for pk in plan["targets"]]
    rollout = rollout_create(
        environment=release.environment, snapshot=snapshot, actor=actor, targets=targets,
        canary_agents=plan["canary_agents"] or None, canary_labels=plan["canary_labels"] or None,
        waves=plan["waves"], canary_gate=plan["canary_gate"], bake_s=plan["bake_s"],
        failure_threshold=plan["failure_threshold"], wave_timeout_s=plan["wave_timeout_s"],
        confirmed=confirmed)
    return {"rollout": rollout.pk}


def scheduled_release_start(*, schedule_id: int) -> str:
    """Start one due scheduled release, or fail it saying why. Safe to run twice at
    once: the second finds it no longer scheduled."""
    schedule = ScheduledRelease.objects.filter(pk=schedule_id).first()
    if schedule is None:
        return "gone"
    try:
        with transaction.atomic():
            # The tenant before the environment: the order rollout_create locks them in.
            locks.lock_one(Tenant.objects, applications__environments=schedule.environment_id)
            env = Environment.objects.lock(schedule.environment_id)
            locked = schedules.schedule_lock(schedule_id)
            if locked.state != ScheduledRelease.State.SCHEDULED:
                return locked.state
            changed = schedules.schedule_refusal(locked, env)
            if changed is not None:
                raise Conflict(changed["message"], code=changed["reason"], details=changed)
            result = _start(locked.release, locked.created_by, locked.confirmed)
            schedules.schedule_started(schedule=locked, environment=env, result=result)
    except ApplicationError as refusal:
        logger.info("scheduled release %s did not start: %s", schedule_id, refusal.message)
        schedules.schedule_failed(schedule_id=schedule_id, code=refusal.code,
                                  message=refusal.message, details=refusal.details)
        return "failed"
    return "started"


def scheduled_releases_start() -> dict:
    """Start every scheduled release that is due (the beat task calls this)."""
    return {schedule_id: scheduled_release_start(schedule_id=schedule_id)
            for schedule_id in schedules.due_schedule_ids(timezone.now())}


@shared_task
def scheduled_releases_start_task() -> dict:
    """Periodic (beat, every 10 s): start the scheduled releases that are due."""
    return scheduled_releases_start()
