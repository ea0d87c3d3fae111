"""Enrollment and agent tokens: enrollment tokens are exchanged once per agent for
its own token; an agent's token can be rotated or revoked, and the agent
decommissioned (its token revoked for good, its name free again). Only SHA-256
hashes of token secrets are stored (apps.core.tokens)."""

import logging
from datetime import datetime

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks, tokens
from apps.core.errors import ApplicationError, Conflict, ValidationFailed
from apps.core.events import emit
from apps.core.text import name_problem
from apps.environments.models import Environment
from apps.fleet.models import Agent, EnrollmentToken
from apps.fleet.rules import decommissioned_refusal
from apps.fleet.services import agent_changed_on_commit, check_labels, pins_set, pushes_supersede
from apps.tenancy.authentication import USER_TOKEN_PREFIX
from apps.tenancy.models import slug_validator

logger = logging.getLogger(__name__)

AGENT_TOKEN_PREFIX = "bwa"
ENROLLMENT_TOKEN_PREFIX = "bwe"
CREATE_ENROLLMENT_TOKEN = ("Create one with `manage.py enrollment_token create <app>/<env>` "
                           "or POST /api/v1/environments/<app>/<env>/enrollment-tokens.")


def misplaced_token(presented: str, *, expected: str) -> str | None:
    """Why a token of another kind was refused where an `expected` ("agent" or
    "enrollment") token goes, or None: it is not one of ours of another kind."""
    presented = (presented or "").strip()
    if expected == "enrollment":
        if presented.startswith(f"{USER_TOKEN_PREFIX}_"):
            return (f"This is an API token ({USER_TOKEN_PREFIX}_…), not an enrollment token "
                    f"({ENROLLMENT_TOKEN_PREFIX}_…). {CREATE_ENROLLMENT_TOKEN}")
        if presented.startswith(f"{AGENT_TOKEN_PREFIX}_"):
            return (f"This is an agent token ({AGENT_TOKEN_PREFIX}_…), not an enrollment "
                    f"token ({ENROLLMENT_TOKEN_PREFIX}_…): an enrolled agent sends it as its "
                    "Authorization: Bearer token (the agent's --token).")
        return None
    if presented.startswith(f"{ENROLLMENT_TOKEN_PREFIX}_"):
        return (f"This is an enrollment token ({ENROLLMENT_TOKEN_PREFIX}_…), not an agent "
                f"token ({AGENT_TOKEN_PREFIX}_…): exchange it at POST /api/v1/agent/enroll "
                "(the agent's --enrollment-token).")
    if presented.startswith(f"{USER_TOKEN_PREFIX}_"):
        return (f"This is an API token ({USER_TOKEN_PREFIX}_…), not an agent token "
                f"({AGENT_TOKEN_PREFIX}_…): an agent gets its token by enrolling with an "
                f"enrollment token. {CREATE_ENROLLMENT_TOKEN}")
    return None


class Unauthenticated(ApplicationError):
    status = 401
    code = "authentication_failed"
    credential_refused = True


def enrollment_token_create(
    *, environment: Environment, max_uses: int, expires_at: datetime, name: str = "", actor
) -> tuple[EnrollmentToken, str]:
    if max_uses < 1:
        raise ValidationFailed("uses must be at least 1.")
    if name_problem(name):
        raise ValidationFailed(f"name: {name_problem(name)}",
                               details=[{"field": "name", "message": name_problem(name)}])
    if expires_at <= timezone.now():
        raise ValidationFailed("The expiry must be in the future.")
    issued = tokens.issue(ENROLLMENT_TOKEN_PREFIX)
    with transaction.atomic():
        token = EnrollmentToken.objects.create(
            environment=environment, name=name, key=issued.key,
            secret_hash=issued.secret_hash, max_uses=max_uses, expires_at=expires_at,
            created_by=actor if getattr(actor, "is_authenticated", False) else None,
        )
        audit_record(actor=actor, action=Action.ENROLLMENT_TOKEN_CREATE, obj=token,
                     environment=environment, tenant=environment.application.tenant,
                     summary=f"Enrollment token {token.key} for {environment.full_name}: "
                             f"{max_uses} use(s) until {expires_at:%Y-%m-%d %H:%M}Z")
    return token, issued.plaintext


def enrollment_token_revoke(*, token: EnrollmentToken, actor) -> EnrollmentToken:
    with transaction.atomic():
        locked = locks.lock_one(EnrollmentToken.objects, pk=token.pk)
        if locked.revoked_at is None:
            locked.revoked_at = timezone.now()
            locked.save(update_fields=["revoked_at"])
            audit_record(actor=actor, action=Action.ENROLLMENT_TOKEN_REVOKE, obj=locked,
                         environment=locked.environment,
                         summary=f"Revoked enrollment token {locked.key}")
    return locked


def agent_enroll(*, enrollment_token: str, name: str, labels: dict) -> tuple[Agent, str]:
    """Exchange an enrollment token for the agent's own token (shown only here)."""
    parsed = tokens.parse(enrollment_token or "", ENROLLMENT_TOKEN_PREFIX)
    refused = Unauthenticated("Unknown, expired, revoked or used-up enrollment token.")
    if parsed is None:
        misplaced = misplaced_token(enrollment_token or "", expected="enrollment")
        raise Unauthenticated(misplaced) if misplaced else refused
    try:
        slug_validator(name)
    except Exception:
        raise ValidationFailed(
            "name: use lowercase letters, digits and hyphens (1-64 characters)."
        ) from None
    labels = check_labels(labels or {})
    key, secret = parsed
    issued = tokens.issue(AGENT_TOKEN_PREFIX)
    with transaction.atomic():
        token = locks.lock_first(EnrollmentToken.objects
                                 .select_related("environment__application__tenant")
                                 .filter(key=key))
        if (
            token is None
            or not tokens.secret_matches(secret, token.secret_hash)
            or token.revoked_at is not None
            or token.expires_at <= timezone.now()
            or token.uses >= token.max_uses
        ):
            raise refused
        environment = token.environment
        if Agent.objects.in_service().filter(environment=environment, name=name).exists():
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
        audit_record(actor=None, action=Action.AGENT_ENROLL, obj=agent, environment=environment,
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
        locked = Agent.objects.lock(agent.pk)
        refused = decommissioned_refusal([locked], "rotate the token")
        if refused is not None:  # a new token would bring the agent back
            raise refused
        old_key = locked.token_key
        locked.token_key, locked.token_hash = issued.key, issued.secret_hash
        locked.token_revoked_at = None
        locked.save(update_fields=["token_key", "token_hash", "token_revoked_at"])
        audit_record(actor=actor, action=Action.AGENT_TOKEN_ROTATE, obj=locked,
                     environment=locked.environment, summary=f"Rotated the token of {locked}")
        agent_changed_on_commit(locked, token_key=old_key)
    return issued.plaintext


def agent_token_revoke(*, agent: Agent, actor) -> Agent:
    with transaction.atomic():
        locked = Agent.objects.lock(agent.pk)
        if locked.token_revoked_at is None:
            locked.token_revoked_at = timezone.now()
            locked.save(update_fields=["token_revoked_at"])
            audit_record(actor=actor, action=Action.AGENT_TOKEN_REVOKE, obj=locked,
                         environment=locked.environment,
                         summary=f"Revoked the token of {locked}")
            agent_changed_on_commit(locked)
    return locked


def agent_decommission_mark(*, agent: Agent, actor) -> Agent:
    """Decommission `agent` (locked; the caller checked its generation and released
    any rollout's hold on it): its token is revoked and its cached poll answers
    dropped on commit, its pins released and pending pushes closed, its name free
    again. Its reports, deployments and audit events stay."""
    locks.require_transaction()
    now = timezone.now()
    refused = decommissioned_refusal([agent], "decommission it")
    if refused is not None:
        raise refused
    pinned = agent.pinned_snapshot.number if agent.pinned_snapshot_id else None
    if agent.pinned_snapshot_id is not None or agent.pin_rollout_id is not None:
        pins_set([agent.pk], snapshot=None)
        agent.refresh_from_db()
    pushes_supersede([agent.pk])
    agent.decommissioned_at = now
    agent.token_revoked_at = agent.token_revoked_at or now
    agent.generation += 1
    agent.save(update_fields=["decommissioned_at", "token_revoked_at", "generation"])
    audit_record(actor=actor, action=Action.AGENT_DECOMMISSION, obj=agent,
                 environment=agent.environment,
                 summary=f"Decommissioned {agent}: token revoked, name free",
                 data={"name": agent.name, "released_pin": pinned,
                       "applied": agent.applied_number})
    agent_changed_on_commit(agent)
    logger.info("agent %s of %s decommissioned", agent.name, agent.environment.full_name)
    return agent
