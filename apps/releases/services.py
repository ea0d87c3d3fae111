"""Release operations: every change that spans the domain apps below (publish,
descriptor submission, environment rollback, activation, push, operator pins,
agent report intake, environment settings that agents poll).

Each reads plan → check → write inside one transaction, takes its locks in the
order apps.core.locks gives (the environment's first, where it changes what the
environment's agents desire), calls the domain apps' inner steps, and queues its
follow-up work on commit. The dashboard, the admin,
the APIs and the management commands call these; no domain app imports them.
"""

import hashlib
import json

from django.db import transaction

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core.dispatch import queue_on_commit
from apps.core.errors import Conflict, NotFound
from apps.environments import services as environments
from apps.environments.models import Descriptor, Environment
from apps.fleet import services as fleet
from apps.fleet.models import Agent, Deployment
from apps.fleet.rules import (
    check_generation,
    going_back_refusal,
    pin_target_refusal,
    push_refusal,
)
from apps.releases.tasks import publication_render_task
from apps.rollouts.models import Rollout
from apps.rollouts.services import refuse_quarantined, rollout_pin_release
from apps.rollouts.tasks import rollout_reconcile_task
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.selectors import descriptor_source, render_source_for
from apps.snapshots.services import publication_create


def _queued(publication: Publication) -> Publication:
    queue_on_commit(publication_render_task, str(publication.pk))
    return publication


def _refuse_during_rollout(environment: Environment, what: str) -> None:
    if Rollout.objects.active_in(environment).exists():
        raise Conflict(f"{environment.full_name} has an active rollout; {what}",
                       code="rollout_active")


def _raise(refusal) -> None:
    if refusal is not None:
        raise refusal


def _refuse_unready(snapshot: Snapshot) -> None:
    if not snapshot.is_ready:
        raise Conflict(f"Snapshot {snapshot.number} is {snapshot.state}.", code="not_ready")


# --- publishing ----------------------------------------------------------------------


def snapshot_publish(*, environment: Environment, actor) -> Publication:
    """Capture the environment's current inputs and queue their render."""
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        return _queued(publication_create(environment=locked, actor=actor,
                                          kind=Publication.Kind.PUBLISH,
                                          source=render_source_for(locked)))


def _descriptor_hash(content: dict) -> str:
    canonical = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def descriptor_submit(*, environment: Environment, descriptor: dict, actor) -> tuple:
    """Publish the environment with an app team's descriptor. Returns (publication,
    created): the same id with the same content returns the first publication; the
    same id with other content is refused (409)."""
    environments.descriptor_check(descriptor)
    digest = _descriptor_hash(descriptor)
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        existing = Descriptor.objects.filter(environment=locked,
                                             descriptor_id=descriptor["id"]).first()
        if existing is not None:
            if existing.content_hash != digest:
                raise Conflict(f"Descriptor {descriptor['id']} was already submitted to "
                               f"{locked.full_name} with other content.",
                               code="descriptor_conflict")
            return existing.publication, False
        publication = publication_create(environment=locked, actor=actor,
                                         kind=Publication.Kind.PUBLISH,
                                         source=descriptor_source(locked, descriptor))
        environments.descriptor_record(environment=locked, descriptor=descriptor,
                                       content_hash=digest, publication=publication,
                                       actor=actor)
        return _queued(publication), True


def snapshot_rollback(*, snapshot: Snapshot, actor) -> Publication:
    """Queue a new snapshot re-rendered from `snapshot`'s stored source; it becomes
    active when stored. Refused while a rollout runs: roll that back instead."""
    if not snapshot.is_ready:
        raise Conflict(f"Snapshot {snapshot.number} is {snapshot.state}; only a ready "
                       "snapshot can be rolled back to.", code="rollback_unavailable")
    with transaction.atomic():
        locked = Environment.objects.lock(snapshot.environment_id)
        _refuse_during_rollout(locked, "roll that back instead.")
        return _queued(publication_create(environment=locked, actor=actor,
                                          kind=Publication.Kind.ROLLBACK,
                                          source=snapshot.source, rolled_back_from=snapshot))


def environment_update(*, environment: Environment, actor, **changes) -> Environment:
    """Change an environment's config, schema or settings; when its poll interval
    changes, every agent's poll answer changes with it. The changes are checked
    before the lock: parsing a config never holds up other writers."""
    environments.check_changes(environment, changes)
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        before = locked.poll_interval_s
        locked = environments.environment_change(environment=locked, actor=actor, **changes)
        if locked.poll_interval_s != before:
            fleet.environment_polls_changed(locked)
    return locked


# --- activation and pushes -------------------------------------------------------------


def _refuse_going_back(environment: Environment, snapshot: Snapshot) -> None:
    active = environment.active_snapshot
    if active is not None and snapshot.number < active.number:
        raise Conflict(
            f"#{snapshot.number} is older than the active #{active.number}; agents refuse "
            "lower numbers. Roll back instead: it re-renders the content as a new snapshot.",
            code="rollback_required")


def snapshot_activate(*, snapshot: Snapshot, actor) -> Snapshot:
    """Activate a ready snapshot explicitly (environments that require it)."""
    with transaction.atomic():
        environment = Environment.objects.lock(snapshot.environment_id)
        _refuse_unready(snapshot)
        refuse_quarantined(snapshot)
        _refuse_during_rollout(environment, "it decides what becomes active.")
        if environment.active_snapshot_id == snapshot.pk:
            return snapshot
        _refuse_going_back(environment, snapshot)
        followers = fleet.environment_activate(environment=environment, snapshot=snapshot)
        audit_record(actor=actor, action=Action.SNAPSHOT_ACTIVATE, obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Activated #{snapshot.number} of {environment.full_name}",
                     data={"number": snapshot.number, "agents": followers})
    return snapshot


def snapshot_deploy(*, snapshot: Snapshot, agent_ids: list[int] | None,
                    actor) -> list[Deployment]:
    """Push `snapshot` now: a pending deployment per agent (all enabled ones when
    `agent_ids` is empty); manual agents are targeted at it."""
    with transaction.atomic():
        environment = Environment.objects.lock(snapshot.environment_id)
        _refuse_unready(snapshot)
        refuse_quarantined(snapshot)
        agents = fleet.agents_chosen(environment, agent_ids)
        _raise(push_refusal(agents, snapshot, environment.active_snapshot))
        deployments = fleet.pushes_create(snapshot=snapshot, agents=agents, actor=actor)
        audit_record(actor=actor, action=Action.SNAPSHOT_DEPLOY, obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Pushed #{snapshot.number} to {len(agents)} agent(s)",
                     data={"agents": [a.name for a in agents]})
    return deployments


def agent_pin(*, agent: Agent, snapshot: Snapshot, expected_generation: int, actor) -> Agent:
    """Hold the agent on `snapshot` whatever is activated or pushed, until released."""
    with transaction.atomic():
        Environment.objects.lock(agent.environment_id)
        locked = Agent.objects.lock(agent.pk)
        check_generation(locked, expected_generation)
        _raise(pin_target_refusal(locked, snapshot))
        refuse_quarantined(snapshot)
        _raise(going_back_refusal(locked, snapshot))
        return fleet.agent_pin_hold(agent=locked, snapshot=snapshot, actor=actor)


def pin_release(*, agent: Agent, rollout_id: int | None, expected_generation: int,
                actor) -> Agent:
    """Release an agent's pin: an operator's (`rollout_id` None) or that of rollout
    `rollout_id`, which must be of the agent's environment."""
    if rollout_id is None:
        return fleet.agent_pin_release(agent=agent, expected_generation=expected_generation,
                                       actor=actor)
    rollout = Rollout.objects.filter(pk=rollout_id, environment_id=agent.environment_id).first()
    if rollout is None:
        raise NotFound(f"Rollout {rollout_id} not found.")
    return rollout_pin_release(agent=agent, rollout=rollout, actor=actor,
                               expected_generation=expected_generation)


# --- agent reports ---------------------------------------------------------------------


def report_intake(*, agent: Agent, deployment_id, number: int, checksum: str, status: str,
                  message: str) -> tuple[Deployment, bool]:
    """Record an agent's report; a new one drives the environment's active rollout
    (its reconcile runs on a worker once the report is committed)."""
    with transaction.atomic():
        deployment, created = fleet.report_record(
            agent=agent, deployment_id=deployment_id, number=number, checksum=checksum,
            status=status, message=message)
        rollout_id = (Rollout.objects.active_in(agent.environment_id)
                      .values_list("pk", flat=True).first())
        if created and rollout_id is not None:
            queue_on_commit(rollout_reconcile_task, rollout_id)
    return deployment, created
