"""State changes of the fleet: enrollment, tokens, modes, activation, push, reports.

Every change of an agent's desired state bumps its generation and, on commit,
drops its cached poll state so its next poll sees the change.
"""

import logging
from datetime import UTC, datetime

from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from apps.audit.services import audit_record
from apps.core import tokens
from apps.core.errors import ApplicationError, Conflict, NotFound, ValidationFailed
from apps.core.events import emit
from apps.environments.models import Environment
from apps.fleet import cache
from apps.fleet.models import Agent, Deployment, EnrollmentToken
from apps.rollouts.models import ACTIVE_STATES, Rollout, SnapshotQuarantine
from apps.snapshots.models import Snapshot
from apps.tenancy.models import slug_validator

logger = logging.getLogger(__name__)

AGENT_TOKEN_PREFIX = "bwa"
ENROLLMENT_TOKEN_PREFIX = "bwe"
MAX_LABELS = 32


class Unauthenticated(ApplicationError):
    status = 401
    code = "authentication_failed"


def forget_polls_on_commit(agents_or_keys) -> None:
    """Drop these agents' cached poll answers once the transaction commits."""
    keys = [a.token_key if isinstance(a, Agent) else a for a in agents_or_keys]
    if keys:
        transaction.on_commit(lambda: cache.forget_poll_states(keys))


def agent_changed_on_commit(agent: Agent, *, token_key: str | None = None) -> None:
    """The agent's poll answer changed: drop its cached poll state (kept under
    `token_key`, its key before a rotation) and tell live pages, on commit."""
    forget_polls_on_commit([token_key or agent.token_key])
    emit("agent", environment_id=agent.environment_id, id=agent.pk)


def environment_polls_changed(environment: Environment) -> None:
    """The poll answer of every agent of `environment` changed (e.g. its interval):
    drop their cached ETags on commit."""
    forget_polls_on_commit(Agent.objects.filter(environment=environment)
                      .values_list("token_key", flat=True))


def _bump(agent_ids) -> None:
    Agent.objects.filter(pk__in=agent_ids).update(generation=F("generation") + 1)


# --- enrollment and tokens ---------------------------------------------------------


def enrollment_token_create(
    *, environment: Environment, max_uses: int, expires_at: datetime, name: str = "", actor
) -> tuple[EnrollmentToken, str]:
    if max_uses < 1:
        raise ValidationFailed("uses must be at least 1.")
    if expires_at <= timezone.now():
        raise ValidationFailed("The expiry must be in the future.")
    issued = tokens.issue(ENROLLMENT_TOKEN_PREFIX)
    with transaction.atomic():
        token = EnrollmentToken.objects.create(
            environment=environment, name=name, key=issued.key,
            secret_hash=issued.secret_hash, max_uses=max_uses, expires_at=expires_at,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        audit_record(actor=actor, action="enrollment_token.create", obj=token,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Enrollment token {token.key} for {environment.full_name}: "
                             f"{max_uses} use(s) until {expires_at:%Y-%m-%d %H:%M}Z")
    return token, issued.plaintext


def enrollment_token_revoke(*, token: EnrollmentToken, actor) -> EnrollmentToken:
    with transaction.atomic():
        locked = EnrollmentToken.objects.select_for_update().get(pk=token.pk)
        if locked.revoked_at is None:
            locked.revoked_at = timezone.now()
            locked.save(update_fields=["revoked_at"])
            audit_record(actor=actor, action="enrollment_token.revoke", obj=locked,
                         environment=locked.environment,
                         summary=f"Revoked enrollment token {locked.key}")
    return locked


def _check_labels(labels) -> dict:
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS or not all(
        isinstance(k, str) and isinstance(v, str) and 0 < len(k) <= 63 and len(v) <= 255
        for k, v in labels.items()
    ):
        raise ValidationFailed(
            f"labels must be an object of at most {MAX_LABELS} string keys (1-63 "
            "characters) to string values (at most 255)."
        )
    return labels


def agent_enroll(*, enrollment_token: str, name: str, labels: dict) -> tuple[Agent, str]:
    """Exchange an enrollment token for the agent's own token (shown only here)."""
    parsed = tokens.parse(enrollment_token or "", ENROLLMENT_TOKEN_PREFIX)
    refused = Unauthenticated("Unknown, expired, revoked or used-up enrollment token.")
    if parsed is None:
        raise refused
    try:
        slug_validator(name)
    except Exception:
        raise ValidationFailed(
            "name: use lowercase letters, digits and hyphens (1-64 characters)."
        ) from None
    labels = _check_labels(labels or {})
    key, secret = parsed
    issued = tokens.issue(AGENT_TOKEN_PREFIX)
    with transaction.atomic():
        token = (EnrollmentToken.objects.select_for_update(of=("self",))
                 .select_related("environment__application__tenant").filter(key=key).first())
        if (
            token is None
            or not tokens.secret_matches(secret, token.secret_hash)
            or token.revoked_at is not None
            or token.expires_at <= timezone.now()
            or token.uses >= token.max_uses
        ):
            raise refused
        environment = token.environment
        if Agent.objects.filter(environment=environment, name=name).exists():
            raise Conflict(f"An agent named {name} already exists in {environment.full_name}.",
                           code="name_taken")
        token.uses += 1
        token.save(update_fields=["uses"])
        try:
            with transaction.atomic():  # a concurrent enrollment may take the name first
                agent = Agent.objects.create(
                    environment=environment, name=name, labels=labels,
                    token_key=issued.key, token_hash=issued.secret_hash,
                )
        except IntegrityError:
            raise Conflict(f"An agent named {name} already exists in {environment.full_name}.",
                           code="name_taken") from None
        audit_record(actor=None, action="agent.enroll", obj=agent, environment=environment,
                     tenant=environment.application.tenant,
                     summary=f"Agent {name} enrolled in {environment.full_name} with "
                             f"token {token.key}", data={"labels": labels})
        emit("agent", environment_id=environment.pk, id=agent.pk)
    logger.info("agent %s enrolled in %s", name, environment.full_name)
    return agent, issued.plaintext


def agent_token_rotate(*, agent: Agent, actor) -> str:
    """Replace the agent's token; the old one is refused from its next request."""
    issued = tokens.issue(AGENT_TOKEN_PREFIX)
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        old_key = locked.token_key
        locked.token_key, locked.token_hash = issued.key, issued.secret_hash
        locked.token_revoked_at = None
        locked.save(update_fields=["token_key", "token_hash", "token_revoked_at"])
        audit_record(actor=actor, action="agent.token_rotate", obj=locked,
                     environment=locked.environment, summary=f"Rotated the token of {locked}")
        agent_changed_on_commit(locked, token_key=old_key)
    return issued.plaintext


def agent_token_revoke(*, agent: Agent, actor) -> Agent:
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        if locked.token_revoked_at is None:
            locked.token_revoked_at = timezone.now()
            locked.save(update_fields=["token_revoked_at"])
            audit_record(actor=actor, action="agent.token_revoke", obj=locked,
                         environment=locked.environment,
                         summary=f"Revoked the token of {locked}")
            agent_changed_on_commit(locked)
    return locked


# --- desired state -----------------------------------------------------------------


def _supersede_pending(agent_ids, *, keep_snapshot: Snapshot | None = None) -> int:
    """Close pending pushes of these agents, except those of `keep_snapshot`."""
    pending = Deployment.objects.filter(agent_id__in=agent_ids, kind=Deployment.Kind.PUSH,
                                        state=Deployment.State.PENDING)
    if keep_snapshot is not None:
        pending = pending.exclude(snapshot=keep_snapshot)
    return pending.update(state=Deployment.State.SUPERSEDED)


def agent_update(*, agent: Agent, actor, **changes) -> Agent:
    """Change mode, enabled or labels. Switching to manual keeps the agent on what
    it desires now; switching to auto_pull closes pushes of other snapshots."""
    unknown = set(changes) - {"mode", "enabled", "labels"}
    if unknown:
        raise ValidationFailed(f"Cannot change {', '.join(sorted(unknown))}.")
    if "mode" in changes and changes["mode"] not in Agent.Mode.values:
        raise ValidationFailed(f"mode must be one of {', '.join(Agent.Mode.values)}.")
    if "labels" in changes:
        _check_labels(changes["labels"])
    with transaction.atomic():
        # Environment before agent: the order activation and push lock in.
        environment = (Environment.objects.select_for_update(of=("self",))
                       .select_related("active_snapshot").get(pk=agent.environment_id))
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        changed = [f for f, v in changes.items() if getattr(locked, f) != v]
        if not changed:
            return locked
        fields = list(changed)
        active = environment.active_snapshot
        if "mode" in changed:
            if changes["mode"] == Agent.Mode.MANUAL:
                locked.target_snapshot = active
                fields.append("target_snapshot")
            else:
                if locked.applied_number is not None and (
                        active is None or locked.applied_number > active.number):
                    raise Conflict(
                        f"{locked.name} has #{locked.applied_number}, newer than the active "
                        f"snapshot; it would refuse to go back. Activate a newer snapshot or "
                        "roll back first.", code="rollback_required")
                _supersede_pending([locked.pk], keep_snapshot=active)
            locked.generation += 1
            fields.append("generation")
        for field in changed:
            setattr(locked, field, changes[field])
        locked.save(update_fields=fields)
        audit_record(actor=actor, action="agent.update", obj=locked,
                     environment=locked.environment,
                     summary=f"Changed {', '.join(changed)} of {locked}",
                     data={f: changes[f] for f in changed})
        agent_changed_on_commit(locked)
    return locked


def environment_activate(*, environment: Environment, snapshot: Snapshot) -> int:
    """Make `snapshot` what auto_pull agents follow; returns how many follow it.
    Call with the environment locked; the caller writes the audit event."""
    environment.active_snapshot = snapshot
    environment.save(update_fields=["active_snapshot"])
    followers = Agent.objects.filter(environment=environment, mode=Agent.Mode.AUTO_PULL,
                                     pinned_snapshot__isnull=True, pin_rollout__isnull=True)
    ids = list(followers.values_list("pk", flat=True))
    _bump(ids)
    _supersede_pending(ids, keep_snapshot=snapshot)
    forget_polls_on_commit(followers.values_list("token_key", flat=True))
    emit("snapshot", environment_id=environment.pk, number=snapshot.number)
    emit("agent", environment_id=environment.pk)
    logger.info("%s: #%s active for %d auto_pull agent(s)", environment.full_name,
                snapshot.number, len(ids))
    return len(ids)


def environment_has_active_rollout(environment: Environment) -> bool:
    return Rollout.objects.filter(environment=environment, state__in=ACTIVE_STATES).exists()


def refuse_quarantined(snapshot: Snapshot) -> None:
    """A snapshot a rollout rolled back is not activated, pushed or pinned again."""
    if SnapshotQuarantine.objects.filter(snapshot=snapshot).exists():
        raise Conflict(f"#{snapshot.number} was rolled back by a rollout and is "
                       "quarantined; roll out a fixed snapshot instead.", code="quarantined")


def snapshot_activate(*, snapshot: Snapshot, actor) -> Snapshot:
    """Activate a ready snapshot explicitly (environments that require it)."""
    with transaction.atomic():
        environment = (Environment.objects.select_for_update(of=("self",))
                       .select_related("active_snapshot", "application__tenant")
                       .get(pk=snapshot.environment_id))
        if not snapshot.is_ready:
            raise Conflict(f"Snapshot {snapshot.number} is {snapshot.state}.", code="not_ready")
        refuse_quarantined(snapshot)
        if environment_has_active_rollout(environment):
            raise Conflict(f"{environment.full_name} has an active rollout; it decides what "
                           "becomes active.", code="rollout_active")
        active = environment.active_snapshot
        if active is not None and active.pk == snapshot.pk:
            return snapshot
        if active is not None and snapshot.number < active.number:
            raise Conflict(
                f"#{snapshot.number} is older than the active #{active.number}; agents refuse "
                "lower numbers. Roll back instead: it re-renders the content as a new snapshot.",
                code="rollback_required",
            )
        followers = environment_activate(environment=environment, snapshot=snapshot)
        audit_record(actor=actor, action="snapshot.activate", obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Activated #{snapshot.number} of {environment.full_name}",
                     data={"number": snapshot.number, "agents": followers})
    return snapshot


def snapshot_deploy(*, snapshot: Snapshot, agent_ids: list[int] | None, actor) -> list[Deployment]:
    """Push `snapshot` now: a pending deployment per agent (all enabled ones when
    `agent_ids` is empty); manual agents are targeted at it."""
    with transaction.atomic():
        environment = (Environment.objects.select_for_update(of=("self",))
                       .select_related("active_snapshot", "application__tenant")
                       .get(pk=snapshot.environment_id))
        if not snapshot.is_ready:
            raise Conflict(f"Snapshot {snapshot.number} is {snapshot.state}.", code="not_ready")
        refuse_quarantined(snapshot)
        agents = Agent.objects.filter(environment=environment)
        if agent_ids:
            agents = agents.filter(pk__in=agent_ids)
        else:
            agents = agents.filter(enabled=True)
        agents = list(agents.select_for_update().order_by("pk"))
        missing = set(agent_ids or []) - {a.pk for a in agents}
        if missing:
            raise NotFound(f"No agents {sorted(missing)} in {environment.full_name}.",
                           details=[{"agent": i} for i in sorted(missing)])
        if not agents:
            raise ValidationFailed(f"{environment.full_name} has no enabled agents.",
                                   code="no_agents")
        active = environment.active_snapshot
        disabled = [a.name for a in agents if not a.enabled]
        if disabled:
            raise Conflict(f"Agents {', '.join(disabled)} are disabled; enable them to push.",
                           code="agent_disabled")
        pinned = [a.name for a in agents
                  if a.pinned_snapshot_id is not None or a.pin_rollout_id is not None]
        if pinned:
            raise Conflict(f"Agents {', '.join(pinned)} are pinned; release their pins to "
                           "push.", code="agent_pinned")
        refusals = []
        for agent in agents:
            if agent.applied_number is not None and agent.applied_number > snapshot.number:
                refusals.append({"agent": agent.pk, "name": agent.name, "reason": (
                    f"has #{agent.applied_number} active; it refuses lower numbers"),
                    "newer": False})
            elif agent.mode == Agent.Mode.AUTO_PULL and (active is None
                                                          or active.pk != snapshot.pk):
                older = active is not None and snapshot.number < active.number
                refusals.append({"agent": agent.pk, "name": agent.name, "reason": (
                    f"follows the active #{active.number}; it would switch back"
                    if older else "follows the active snapshot; activate this one first"),
                    "newer": not older})
        if refusals:
            # Going back needs a rollback; only a newer snapshot merely needs activating.
            newer = [r.pop("newer") for r in refusals]
            code = "not_active" if all(newer) else "rollback_required"
            raise Conflict(
                f"Cannot push #{snapshot.number} to {len(refusals)} agent(s); "
                + ("activate it first, or switch them to manual." if code == "not_active"
                   else "roll back, or switch them to manual."),
                code=code, details=refusals)
        ids = [a.pk for a in agents]
        _supersede_pending(ids)
        deployments = Deployment.objects.bulk_create([
            Deployment(agent=a, snapshot=snapshot, kind=Deployment.Kind.PUSH,
                       created_by=actor if getattr(actor, "is_authenticated", False) else None)
            for a in agents
        ])
        Agent.objects.filter(pk__in=ids, mode=Agent.Mode.MANUAL).update(target_snapshot=snapshot)
        _bump(ids)
        forget_polls_on_commit(agents)
        emit("agent", environment_id=environment.pk)
        audit_record(actor=actor, action="snapshot.deploy", obj=snapshot,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Pushed #{snapshot.number} to {len(agents)} agent(s)",
                     data={"agents": [a.name for a in agents]})
    return deployments


# --- pins --------------------------------------------------------------------------


def check_generation(agent: Agent, expected_generation: int) -> None:
    """Compare and set: refuse (409 stale) when the agent changed since it was read."""
    if agent.generation != expected_generation:
        raise Conflict(f"{agent.name} changed since you loaded it (generation "
                       f"{agent.generation}, not {expected_generation}).", code="stale",
                       details=[{"agent": agent.pk, "generation": agent.generation}])


def agent_pin(*, agent: Agent, snapshot: Snapshot, expected_generation: int, actor) -> Agent:
    """Hold the agent on `snapshot` whatever is activated or pushed, until released."""
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        check_generation(locked, expected_generation)
        if locked.pin_rollout_id is not None:
            raise Conflict(f"{locked.name} is pinned by rollout {locked.pin_rollout_id}.",
                           code="agent_pinned")
        if snapshot.environment_id != locked.environment_id or not snapshot.is_ready:
            raise ValidationFailed(f"Snapshot {snapshot.number} is not a ready snapshot of "
                                   "the agent's environment.")
        refuse_quarantined(snapshot)
        if locked.applied_number is not None and snapshot.number < locked.applied_number:
            raise Conflict(f"{locked.name} has #{locked.applied_number}; it refuses lower "
                           "numbers. Roll back instead.", code="rollback_required")
        locked.pinned_snapshot, locked.pinned_at = snapshot, timezone.now()
        locked.pinned_by = actor if getattr(actor, "is_authenticated", False) else None
        locked.generation += 1
        locked.save(update_fields=["pinned_snapshot", "pinned_at", "pinned_by", "generation"])
        _supersede_pending([locked.pk], keep_snapshot=snapshot)
        audit_record(actor=actor, action="agent.pin", obj=locked, environment=locked.environment,
                     summary=f"Pinned {locked} to #{snapshot.number}",
                     data={"number": snapshot.number})
        agent_changed_on_commit(locked)
    return locked


def agent_pin_release(*, agent: Agent, expected_generation: int, actor) -> Agent:
    """Release the agent's pin: it follows its manual target or the active snapshot."""
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        check_generation(locked, expected_generation)
        if locked.pin_rollout_id is not None:
            raise Conflict(f"{locked.name} is pinned by rollout {locked.pin_rollout_id}; "
                           "release it with that rollout's id.", code="rollout_pin")
        if locked.pinned_snapshot_id is None:
            raise Conflict(f"{locked.name} is not pinned.", code="not_pinned")
        number = locked.pinned_snapshot.number
        locked.pinned_snapshot, locked.pinned_at, locked.pinned_by = None, None, None
        locked.generation += 1
        locked.save(update_fields=["pinned_snapshot", "pinned_at", "pinned_by", "generation"])
        audit_record(actor=actor, action="agent.pin_release", obj=locked,
                     environment=locked.environment,
                     summary=f"Released the pin of {locked} (#{number})",
                     data={"number": number})
        agent_changed_on_commit(locked)
    return locked


# --- reports -----------------------------------------------------------------------


def report_record(
    *, agent: Agent, deployment_id, number: int, checksum: str, status: str, message: str
) -> tuple[Deployment, bool]:
    """Record an agent's report. Returns (deployment, created); a duplicate changes
    nothing and returns created=False."""
    if status not in Deployment.REPORTED_STATES:
        raise ValidationFailed("status must be succeeded, warning or failed.")
    with transaction.atomic():
        locked = Agent.objects.select_for_update().get(pk=agent.pk)
        deployment = None
        if deployment_id is not None:
            deployment = (Deployment.objects.select_for_update(of=("self",))
                          .select_related("snapshot")
                          .filter(pk=deployment_id, agent=locked).first())
            if deployment is None:
                raise NotFound(f"No deployment {deployment_id} for this agent.")
            if (deployment.snapshot.number, deployment.snapshot.checksum) != (number, checksum):
                raise Conflict(f"Deployment {deployment_id} is of snapshot "
                               f"#{deployment.snapshot.number} with another checksum.",
                               code="report_conflict")
        snapshot = Snapshot.objects.filter(environment_id=locked.environment_id, number=number,
                                           state=Snapshot.State.READY).first()
        if snapshot is None:
            raise ValidationFailed(f"snapshot: no ready snapshot {number} in this environment.")
        if checksum != snapshot.checksum:
            raise ValidationFailed(f"checksum: does not match snapshot {number}.",
                                   code="checksum_mismatch")
        now = timezone.now()
        if deployment is not None:
            if deployment.state in Deployment.REPORTED_STATES:
                if (deployment.state, deployment.message) == (status, message):
                    return deployment, False
                raise Conflict(f"Deployment {deployment_id} was already reported "
                               f"{deployment.state} with another message.",
                               code="report_conflict")
            deployment.state, deployment.message = status, message
            deployment.reported_checksum, deployment.reported_at = checksum, now
            deployment.save(update_fields=["state", "message", "reported_checksum",
                                           "reported_at"])
            # The announced deployment is done: the poll answer changes.
            forget_polls_on_commit([locked])
        else:
            latest = (Deployment.objects.filter(agent=locked, reported_at__isnull=False)
                      .order_by("-reported_at").first())
            if latest is not None and latest.kind == Deployment.Kind.PULL and (
                latest.snapshot_id, latest.state, latest.message) == (snapshot.pk, status, message):
                return latest, False
            deployment = Deployment.objects.create(
                agent=locked, snapshot=snapshot, kind=Deployment.Kind.PULL, state=status,
                message=message, reported_checksum=checksum, reported_at=now)
        fields = ["last_status", "last_message", "last_report_at"]
        locked.last_status, locked.last_message, locked.last_report_at = status, message, now
        if status == Deployment.State.SUCCEEDED:
            # A late report of an older success must not move the applied snapshot back.
            if locked.applied_number is None or number >= locked.applied_number:
                locked.applied_number, locked.applied_checksum = number, checksum
                fields += ["applied_number", "applied_checksum"]
            if locked.blocked_number is not None and number >= locked.blocked_number:
                locked.blocked_number, locked.blocked_checksum = None, ""
                fields += ["blocked_number", "blocked_checksum"]
        else:
            locked.blocked_number, locked.blocked_checksum = number, checksum
            fields += ["blocked_number", "blocked_checksum"]
        locked.save(update_fields=fields)
        emit("deployment", environment_id=locked.environment_id, id=str(deployment.pk),
             agent=locked.pk, snapshot=number)
        emit("agent", environment_id=locked.environment_id, id=locked.pk)
        from apps.rollouts.services import rollout_report_received  # rollouts build on fleet

        rollout_report_received(environment_id=locked.environment_id)
    logger.info("agent %s reported #%s %s%s", locked.name, number, status,
                f": {message}" if message else "")
    return deployment, True


def heartbeats_flush() -> int:
    """Copy heartbeats from the cache to agents' last_seen_at, in batches."""
    updated = 0
    ids = list(Agent.objects.values_list("pk", flat=True))
    for start in range(0, len(ids), 1000):
        batch = ids[start:start + 1000]
        beats = cache.heartbeats(batch)
        agents = []
        for agent in Agent.objects.filter(pk__in=beats).only("pk", "last_seen_at"):
            seen = datetime.fromtimestamp(beats[agent.pk], tz=UTC)
            if agent.last_seen_at is None or seen > agent.last_seen_at:
                agent.last_seen_at = seen
                agents.append(agent)
        Agent.objects.bulk_update(agents, ["last_seen_at"], batch_size=500)
        updated += len(agents)
    return updated
