"""Release operations: every change that spans the domain apps below (publish,
descriptor submission, environment rollback, activation, push, operator pins,
decommissioning an agent, agent report intake, environment settings that agents poll,
a member leaving a tenant with the environments they owned there).

Each reads plan → check → write inside one transaction, takes its locks in the
order apps.core.locks gives (the environment's first, where it changes what the
environment's agents desire), calls the domain apps' inner steps, and queues its
follow-up work on commit. The dashboard, the admin,
the APIs and the management commands call these; no domain app imports them.
"""

import hashlib
import json

from django.conf import settings
from django.db import transaction

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.dispatch import queue_on_commit
from apps.core.errors import ApplicationError, Conflict, NotFound
from apps.environments import services as environments
from apps.environments.models import Descriptor, Environment
from apps.fleet import services as fleet
from apps.fleet.enrollment import agent_decommission_mark
from apps.fleet.models import Agent, Deployment
from apps.fleet.reports import Recorded, Report, reports_record
from apps.fleet.rules import (
    check_generation,
    decommissioned_refusal,
    going_back_refusal,
    pin_target_refusal,
    push_refusal,
)
from apps.governance.gates import release_gate
from apps.governance.rules import activation_plan, push_plan
from apps.releases.rules import publication_activates_by_policy
from apps.releases.tasks import publication_render_task
from apps.rollouts.models import Rollout, RolloutTarget
from apps.rollouts.quarantine import quarantine_lift, refuse_quarantined
from apps.rollouts.services import rollout_pin_release
from apps.rollouts.tasks import rollout_reconcile_task
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.promotion import promotion_source
from apps.snapshots.selectors import descriptor_source, render_source_for
from apps.snapshots.services import publication_create
from apps.tenancy import services as tenancy
from apps.tenancy.models import Membership, Tenant


def _activates(environment: Environment, kind: str) -> bool:
    return publication_activates_by_policy(release_policy=environment.release_policy,
                                           is_rollback=kind == Publication.Kind.ROLLBACK)


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


def snapshot_publish(*, environment: Environment, actor, promoted: Snapshot | None = None,
                     confirmed: bool = False) -> Publication:
    """Capture the environment's current inputs and queue their render; with
    `promoted` (another environment's snapshot), that release applied to these
    inputs (apps.snapshots.promotion). `confirmed`: a degenerate render (emptied
    files, a sharp shrink) is accepted up front instead of held for confirmation."""
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        source = (render_source_for(locked) if promoted is None
                  else promotion_source(locked, promoted))
        return _queued(publication_create(environment=locked, actor=actor,
                                          kind=Publication.Kind.PUBLISH, source=source,
                                          activates=_activates(locked, "publish"),
                                          confirmed=confirmed))


def _descriptor_hash(content: dict) -> str:
    canonical = json.dumps(content, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def descriptor_submit(*, environment: Environment, descriptor: dict, actor,
                      confirmed: bool = False) -> tuple:
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
                                         source=descriptor_source(locked, descriptor),
                                         activates=_activates(locked, "publish"),
                                         confirmed=confirmed)
        environments.descriptor_record(environment=locked, descriptor=descriptor,
                                       content_hash=digest, publication=publication,
                                       actor=actor)
        return _queued(publication), True


def snapshot_rollback(*, snapshot: Snapshot, actor, confirmed: bool = False) -> Publication:
    """Queue a new snapshot re-rendered from `snapshot`'s stored source; it becomes
    active when stored. Refused while a rollout runs (roll that back instead), for
    quarantined content (whatever the number of the snapshot holding it), and by the
    release gate as an activation of `snapshot`'s content: a freeze (an owner's
    override lets an emergency through), a degenerate render unless `confirmed`,
    and, in a governed environment, content never active here until approved. The
    approved release is only checked here: it is used when the re-rendered snapshot
    is activated (apps.releases.publishing), so a render that fails uses nothing."""
    if not snapshot.is_ready:
        raise Conflict(f"Snapshot {snapshot.number} is {snapshot.state}; only a ready "
                       "snapshot can be rolled back to.", code="rollback_unavailable")
    with transaction.atomic():
        locked = Environment.objects.lock(snapshot.environment_id)
        _refuse_during_rollout(locked, "roll that back instead.")
        refuse_quarantined(snapshot)
        release_gate(environment=locked, snapshot=snapshot, plan=activation_plan(),
                     actor=actor, what="rollback", confirmed=confirmed, restores=True,
                     use=False)
        return _queued(publication_create(environment=locked, actor=actor,
                                          kind=Publication.Kind.ROLLBACK,
                                          source=snapshot.source, rolled_back_from=snapshot,
                                          activates=True, confirmed=confirmed))


def environment_update(*, environment: Environment, actor,
                       expected_version: int | None = None, **changes) -> Environment:
    """Change an environment's config, schema or settings (release policy, poll
    interval, drift policy, keeping rollout pins), at `expected_version` when given
    (409 stale otherwise); when its poll interval or drift policy changes, every
    agent's poll answer changes with it. The changes are checked before the lock:
    parsing a config never holds up other writers."""
    environments.check_changes(environment, changes)
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        environments.check_version(locked, expected_version)
        before = (locked.poll_interval_s, locked.drift_policy)
        locked = environments.environment_change(environment=locked, actor=actor, **changes)
        if (locked.poll_interval_s, locked.drift_policy) != before:
            fleet.environment_polls_changed(locked)
    return locked


def _files_reset(environment: Environment, kind: str, wanted: dict, actor) -> None:
    """Make the environment's files of `kind` exactly `wanted` {path: text}; each
    change is audited as its own kind (template.update, fallback.delete, ...)."""
    existing = (environment.templates if kind == "template" else environment.fallback_files)
    for path in existing.exclude(path__in=list(wanted)).values_list("path", flat=True):
        environments.environment_file_delete(environment=environment, kind=kind, path=path,
                                              actor=actor)
    for path, text in wanted.items():
        environments.environment_file_put(environment=environment, kind=kind, path=path,
                                          text=text, actor=actor)


def environment_inputs_reset(*, environment: Environment, actor) -> Environment:
    """Reset the environment's inputs (config, schema, templates, fallback files) to
    the active snapshot's stored source: after a rollback the inputs still hold the
    change rolled back. Each input changed is audited as usual (so it is pending
    until a snapshot holds it), the reset itself as environment.reset."""
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        active = locked.active_snapshot
        if active is None:
            raise Conflict(f"{locked.full_name} has no active snapshot to reset to.",
                           code="no_active_snapshot")
        _refuse_during_rollout(locked, "it decides what becomes active.")
        source = active.source
        environments.check_changes(locked, {"config": source["config"]})
        environments.environment_change(environment=locked, actor=actor,
                                        config=source["config"],
                                        config_schema=source["config_schema"])
        _files_reset(locked, "template",
                     {t["path"]: t["source"] for t in source["templates"]}, actor)
        _files_reset(locked, "fallback",
                     {f["path"]: f["content"] for f in source["fallback_files"]}, actor)
        audit_record(actor=actor, action=Action.ENVIRONMENT_RESET, obj=locked,
                     environment=locked, tenant=locked.application.tenant,
                     summary=f"Reset the inputs of {locked.full_name} to #{active.number}'s "
                             "source", data={"number": active.number})
    return locked


def snapshot_quarantine_lift(*, snapshot: Snapshot, actor, reason: str = "") -> None:
    """Lift the quarantine of `snapshot`'s content (an owner's act, audited)."""
    quarantine_lift(environment=snapshot.environment, number=snapshot.number, actor=actor,
                    reason=reason)


# --- activation and pushes -------------------------------------------------------------


def _refuse_going_back(environment: Environment, snapshot: Snapshot) -> None:
    active = environment.active_snapshot
    if active is not None and snapshot.number < active.number:
        raise Conflict(
            f"#{snapshot.number} is older than the active #{active.number}; agents refuse "
            "lower numbers. Roll back instead: it re-renders the content as a new snapshot.",
            code="rollback_required")


def snapshot_activate(*, snapshot: Snapshot, actor, override_reason: str | None = None,
                      confirmed: bool = False, restores: bool = False,
                      gated_as: Snapshot | None = None) -> Snapshot:
    """Activate a ready snapshot explicitly (environments that require it);
    quarantined content only with an owner's `override_reason`; then the release
    gate (a degenerate render only `confirmed`; `restores`: a rollback's snapshot;
    `gated_as`: the snapshot whose content the gate judges, when not this one —
    a rollback's re-render of exactly the restored content)."""
    with transaction.atomic():
        environment = Environment.objects.lock(snapshot.environment_id)
        _refuse_unready(snapshot)
        refuse_quarantined(snapshot, actor=actor, override_reason=override_reason,
                           what="activated")
        _refuse_during_rollout(environment, "it decides what becomes active.")
        if environment.active_snapshot_id == snapshot.pk:
            return snapshot
        _refuse_going_back(environment, snapshot)
        release_gate(environment=environment, snapshot=gated_as or snapshot,
                     plan=activation_plan(), actor=actor, what="activation",
                     confirmed=confirmed, restores=restores)
        followers = fleet.environment_activate(environment=environment, snapshot=snapshot)
        audit_record(actor=actor, action=Action.SNAPSHOT_ACTIVATE, obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Activated #{snapshot.number} of {environment.full_name}",
                     data={"number": snapshot.number, "agents": followers})
    return snapshot


def snapshot_deploy(*, snapshot: Snapshot, agent_ids: list[int] | None, actor,
                    override_reason: str | None = None,
                    confirmed: bool = False) -> list[Deployment]:
    """Push `snapshot` now: a pending deployment per agent (all enabled ones when
    `agent_ids` is empty); manual agents are targeted at it. The release gate: a
    degenerate render only `confirmed`."""
    with transaction.atomic():
        environment = Environment.objects.lock(snapshot.environment_id)
        _refuse_unready(snapshot)
        refuse_quarantined(snapshot, actor=actor, override_reason=override_reason,
                           what="pushed")
        agents = fleet.agents_chosen(environment, agent_ids)
        _raise(push_refusal(agents, snapshot, environment.active_snapshot))
        release_gate(environment=environment, snapshot=snapshot, plan=push_plan(agent_ids),
                     actor=actor, what="push", confirmed=confirmed)
        deployments = fleet.pushes_create(snapshot=snapshot, agents=agents, actor=actor)
        audit_record(actor=actor, action=Action.SNAPSHOT_DEPLOY, obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Pushed #{snapshot.number} to {len(agents)} agent(s)",
                     data={"agents": [a.name for a in agents]})
    return deployments


def agent_pin(*, agent: Agent, snapshot: Snapshot, expected_generation: int, actor,
              override_reason: str | None = None, confirmed: bool = False) -> Agent:
    """Hold the agent on `snapshot` whatever is activated or pushed, until released
    (a degenerate render only `confirmed`)."""
    with transaction.atomic():
        environment = Environment.objects.lock(agent.environment_id)
        locked = Agent.objects.lock(agent.pk)
        locked.environment = environment
        _raise(decommissioned_refusal([locked], f"pin #{snapshot.number}"))
        check_generation(locked, expected_generation)
        _raise(pin_target_refusal(locked, snapshot))
        refuse_quarantined(snapshot, actor=actor, override_reason=override_reason,
                           what="pinned")
        _raise(going_back_refusal(locked, snapshot))
        _gate_pin(locked, snapshot, actor, confirmed)
        return fleet.agent_pin_hold(agent=locked, snapshot=snapshot, actor=actor)


def _gate_pin(agent: Agent, snapshot: Snapshot, actor, confirmed: bool) -> None:
    """A pin to any content but the active snapshot's releases it to that agent (an
    older snapshot may hold content never released): it passes the gates of a push
    to it, but as a rollback does, content once active here needs no new approval.
    Holding an agent on the active content releases nothing new (and is how a host
    is held still in a freeze)."""
    active_id = agent.environment.active_snapshot_id
    active = active_id and (Snapshot.objects.filter(pk=active_id)
                            .values_list("checksum", flat=True).first())
    if snapshot.checksum != active:
        release_gate(environment=agent.environment, snapshot=snapshot,
                     plan=push_plan([agent.pk]), actor=actor, what="pin", confirmed=confirmed,
                     restores=True)


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


def agent_decommission(*, agent: Agent, expected_generation: int, actor) -> Agent:
    """Decommission an agent at `expected_generation` (CAS): its token is revoked,
    its history kept, its name free for a new agent. A rollout holding it lets it
    go: its target is released (a decommissioned target neither blocks nor
    acknowledges a wave) and the rollout driven again on commit."""
    with transaction.atomic():
        Environment.objects.lock(agent.environment_id)
        locked = Agent.objects.lock(agent.pk)
        _raise(decommissioned_refusal([locked], "decommission it"))
        check_generation(locked, expected_generation)
        targets = RolloutTarget.objects.filter(agent=locked).exclude(
            state=RolloutTarget.State.RELEASED)
        if locked.pin_rollout_id is not None:
            targets.filter(rollout_id=locked.pin_rollout_id).update(
                state=RolloutTarget.State.RELEASED)
        agent_decommission_mark(agent=locked, actor=actor)
        rollout_id = (Rollout.objects.active_in(locked.environment_id)
                      .values_list("pk", flat=True).first())
        if rollout_id is not None:
            queue_on_commit(rollout_reconcile_task, rollout_id)
    return locked


# --- agent reports ---------------------------------------------------------------------


def reports_intake(reports: list[Report]) -> list[Recorded | ApplicationError]:
    """Record agents' reports in one transaction (apps.fleet.reports: each recorded
    or refused alone); the new ones drive their environments' active rollouts (each
    rollout's reconcile runs on a worker once the reports are committed)."""
    with transaction.atomic():
        results = reports_record(reports)
        reported = {report.agent_id for report, result in zip(reports, results, strict=True)
                    if isinstance(result, Recorded) and result.created}
        if reported:
            environments = Agent.objects.filter(pk__in=reported).values("environment_id")
            for rollout_id in (Rollout.objects.active().filter(environment_id__in=environments)
                               .order_by().values_list("pk", flat=True)):
                # One run per rollout per window, however many reports a wave brings.
                queue_on_commit(rollout_reconcile_task, rollout_id,
                                coalesce_s=settings.BELLWETHER_RECONCILE_COALESCE_S)
    return results


def report_intake(*, agent: Agent, deployment_id, number: int, checksum: str, status: str,
                  message: str, health: dict | None = None) -> tuple[Deployment, bool]:
    """Record one agent's report (reports_intake); a refusal is raised."""
    [result] = reports_intake([Report(agent.pk, deployment_id, number, checksum, status,
                                      message, health, agent.token_key)])
    if isinstance(result, ApplicationError):
        raise result
    return result


# --- memberships -------------------------------------------------------------------------


def member_remove(*, membership: Membership, actor) -> None:
    """Remove a member from a tenant, and with the membership every ownership of the
    tenant's environments they held (outside a tenant every role is an outsider)."""
    with transaction.atomic():
        tenant = locks.lock_one(Tenant.objects, pk=membership.tenant_id)
        environments.environment_owners_drop(tenant=tenant, user=membership.user, actor=actor)
        tenancy.membership_remove(membership=membership, actor=actor)
