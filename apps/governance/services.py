"""Approvals: an environment's rule, releases asking for approval, approving,
rejecting, skipping and withdrawing them. Each locks the environment, then the
release (the order of apps.core.locks), checks, writes, and audits in the same
transaction. The gates that activation, pushes and rollouts pass are in
apps.governance.gates."""

from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core.errors import Conflict, NotFound, PermissionDenied, ValidationFailed
from apps.core.events import announce
from apps.environments.models import Environment
from apps.fleet.selectors import refuse_agents_outside
from apps.governance import rules, selectors
from apps.governance.models import Approval, ApprovalRule, ReleaseRequest
from apps.snapshots.models import Snapshot


def _audit(actor, action: Action, obj, environment: Environment, summary: str,
           **data) -> None:
    audit_record(actor=actor, action=action, obj=obj, environment=environment,
                 tenant=environment.application.tenant, summary=summary, data=data)


def approval_rule_set(*, environment: Environment, actor, required_approvals: int,
                      owners_approve: bool = True, approver_groups: list[str] = (),
                      admins_may_skip: bool = False, strict: bool = False,
                      expected_version: int | None = None) -> ApprovalRule:
    """Set the environment's approval rule (an owner's act). Releases already
    submitted keep the rule they were submitted under unless it says `strict`."""
    if not 0 <= required_approvals <= 10:
        raise ValidationFailed("required_approvals is 0 to 10.", details={
            "field": "required_approvals"})
    groups = list(Group.objects.filter(name__in=list(approver_groups)))
    unknown = sorted(set(approver_groups) - {g.name for g in groups})
    if unknown:
        raise ValidationFailed(f"No group named {', '.join(unknown)}.", code="unknown_group",
                               details={"field": "approver_groups", "unknown": unknown})
    with transaction.atomic():
        env = Environment.objects.lock(environment.pk)
        # Under the environment's lock: no other writer creates or changes the rule.
        rule, created = ApprovalRule.objects.get_or_create(environment=env)
        if expected_version is not None and rule.version != expected_version and not created:
            raise Conflict(f"The approval rule changed since you loaded it (version "
                           f"{rule.version}).", code="stale", details={"version": rule.version})
        rule.required_approvals, rule.owners_approve = required_approvals, owners_approve
        rule.admins_may_skip, rule.strict = admins_may_skip, strict
        rule.version = rule.version + (0 if created else 1)
        rule.save()
        rule.approver_groups.set(groups)
        _audit(actor, Action.APPROVAL_RULE_SET, rule, env,
               f"{env.full_name} needs {required_approvals} approval(s)"
               + (" (strict)" if strict else ""), **selectors.rule_of(env.pk))
    return rule


def _check_content(environment: Environment, snapshot: Snapshot, plan: dict) -> None:
    """A release names a ready snapshot of its environment, and a plan naming only
    agents of it (400 unknown_agents naming the plan's field and the ids)."""
    if snapshot.environment_id != environment.pk or not snapshot.is_ready:
        raise ValidationFailed(f"#{snapshot.number} is not a ready snapshot of "
                               f"{environment.full_name}.", details={"field": "snapshot"})
    refuse_agents_outside(environment, **{
        f"plan.{field}": plan[field] for field in rules.PLAN_AGENT_FIELDS
        if isinstance(plan.get(field), list)})


def _refuse_duplicate(environment: Environment, snapshot: Snapshot, digest: str,
                      exclude: int | None = None) -> None:
    existing = (ReleaseRequest.objects.filter(environment=environment, snapshot=snapshot,
                                              plan_digest=digest,
                                              state=ReleaseRequest.State.OPEN)
                .exclude(pk=exclude).values_list("pk", flat=True).first())
    if existing is not None:
        raise Conflict(f"Release {existing} already asks for exactly this content.",
                       code="release_exists", details={"release": existing})


def release_submit(*, environment: Environment, snapshot: Snapshot, plan: dict, actor,
                   note: str = "") -> ReleaseRequest:
    """Ask for approval of `snapshot` released by `plan`; the environment's rule now
    is recorded with it (what it is held to, unless the environment turns strict)."""
    with transaction.atomic():
        env = Environment.objects.lock(environment.pk)
        _check_content(env, snapshot, plan)
        digest = rules.plan_digest(plan)
        _refuse_duplicate(env, snapshot, digest)
        try:
            with transaction.atomic():
                release = ReleaseRequest.objects.create(
                    environment=env, snapshot=snapshot, checksum=snapshot.checksum, plan=plan,
                    plan_digest=digest, rule=selectors.rule_of(env.pk), note=note,
                    requested_by=actor if getattr(actor, "is_authenticated", False) else None)
        except IntegrityError:
            raise Conflict("A release already asks for exactly this content.",
                           code="release_exists") from None
        _audit(actor, Action.RELEASE_SUBMIT, release, env,
               f"Release {release.pk}: #{snapshot.number} by {rules.describe_plan(plan)} asks "
               f"for {release.rule['required']} approval(s)", number=snapshot.number,
               checksum=snapshot.checksum, plan_digest=digest)
        announce("approval.requested", environment_id=env.pk, approval=release.pk,
                 snapshot=snapshot.number, requested_by=getattr(actor, "username", None))
    return release


def locked_release(release_id: int, expected_version: int | None = None) -> ReleaseRequest:
    release = ReleaseRequest.objects.lock(release_id)
    if release is None:
        raise NotFound(f"Release {release_id} not found.")
    if expected_version is not None and release.version != expected_version:
        raise Conflict(f"Release {release_id} changed since you loaded it (version "
                       f"{release.version}).", code="stale",
                       details={"version": release.version, "checksum": release.checksum,
                                "plan_digest": release.plan_digest})
    return release


def _cancel_decisions(release: ReleaseRequest, why: str) -> int:
    return release.approvals.filter(cancelled_at__isnull=True).update(
        cancelled_at=timezone.now(), cancel_reason=why[:200])


def release_update(*, release: ReleaseRequest, actor, expected_version: int,
                   snapshot: Snapshot | None = None, plan: dict | None = None) -> ReleaseRequest:
    """Change the snapshot or the plan of an open (or rejected) release: every
    decision given is cancelled (it named other content) and it asks again; the
    actor is one of its editors (an author: never its approver)."""
    with transaction.atomic():
        env = Environment.objects.lock(release.environment_id)
        locked = locked_release(release.pk, expected_version)
        if locked.state not in (ReleaseRequest.State.OPEN, ReleaseRequest.State.REJECTED):
            raise Conflict(f"Release {locked.pk} is {locked.state}.", code="release_closed")
        snapshot, plan = snapshot or locked.snapshot, plan or locked.plan
        _check_content(env, snapshot, plan)
        digest = rules.plan_digest(plan)
        if (snapshot.pk, snapshot.checksum, digest) == (
                locked.snapshot_id, locked.checksum, locked.plan_digest):
            return locked
        _refuse_duplicate(env, snapshot, digest, exclude=locked.pk)
        cancelled = _cancel_decisions(locked, "the snapshot or the plan changed")
        locked.snapshot, locked.checksum, locked.plan, locked.plan_digest = (
            snapshot, snapshot.checksum, plan, digest)
        locked.state, locked.version, locked.skipped_by, locked.skip_reason = (
            ReleaseRequest.State.OPEN, locked.version + 1, None, "")
        locked.save()
        if getattr(actor, "is_authenticated", False):
            locked.editors.add(actor)
        _audit(actor, Action.RELEASE_UPDATE, locked, env,
               f"Release {locked.pk} changed to #{snapshot.number} by "
               f"{rules.describe_plan(plan)}; {cancelled} decision(s) cancelled",
               number=snapshot.number, checksum=snapshot.checksum, plan_digest=digest,
               cancelled=cancelled)
    return locked


def _check_names_content(release: ReleaseRequest, checksum: str, plan_digest: str) -> None:
    if (checksum, plan_digest) != (release.checksum, release.plan_digest):
        raise Conflict(f"Release {release.pk} no longer holds the content you reviewed: it is "
                       f"#{release.snapshot.number} ({release.checksum}) by "
                       f"{rules.describe_plan(release.plan)} now.", code="stale",
                       details={"checksum": release.checksum,
                                "plan_digest": release.plan_digest,
                                "version": release.version})


def release_decide(*, release: ReleaseRequest, actor, decision: str, checksum: str,
                   plan_digest: str, comment: str = "") -> ReleaseRequest:
    """Approve or reject `release`, naming the content reviewed (its snapshot's
    checksum and its plan's digest): other content is refused (409 stale). The author
    may not decide; each person decides once; a rejection needs a comment."""
    if decision == Approval.Decision.REJECT and not comment.strip():
        raise ValidationFailed("A rejection needs a comment.", code="comment_required",
                               details={"field": "comment"})
    with transaction.atomic():
        env = Environment.objects.lock(release.environment_id)
        locked = locked_release(release.pk)
        if locked.state != ReleaseRequest.State.OPEN:
            raise Conflict(f"Release {locked.pk} is {locked.state}.", code="release_closed")
        _check_names_content(locked, checksum, plan_digest)
        refusal = selectors.approver_refusal(user=actor, release=locked)
        if refusal is not None:
            raise PermissionDenied(f"You may not decide on release {locked.pk}: {refusal}.",
                                   code="not_an_approver")
        if locked.approvals.filter(approver=actor, cancelled_at__isnull=True).exists():
            raise Conflict(f"You already decided on release {locked.pk}.",
                           code="already_decided")
        Approval.objects.create(release=locked, approver=actor, decision=decision,
                                checksum=checksum, plan_digest=plan_digest,
                                comment=comment.strip())
        if decision == Approval.Decision.REJECT:
            locked.state = ReleaseRequest.State.REJECTED
            locked.save(update_fields=["state", "updated_at"])
        action = Action.RELEASE_APPROVE if decision == "approve" else Action.RELEASE_REJECT
        _audit(actor, action, locked, env, f"Release {locked.pk} {decision}d"
               + (f": {comment.strip()}" if comment.strip() else ""), checksum=checksum,
               plan_digest=plan_digest, comment=comment.strip())
        if decision == Approval.Decision.APPROVE:
            announce("approval.given", environment_id=env.pk, approval=locked.pk,
                     snapshot=locked.snapshot.number, given_by=actor.username)
    return locked


def release_skip(*, release: ReleaseRequest, actor, reason: str) -> ReleaseRequest:
    """A platform admin's skip of the approvals, where the rule allows it (audited)."""
    if not reason.strip():
        raise ValidationFailed("Skipping approvals needs a reason.", code="reason_required",
                               details={"field": "reason"})
    with transaction.atomic():
        env = Environment.objects.lock(release.environment_id)
        locked = locked_release(release.pk)
        if locked.state != ReleaseRequest.State.OPEN:
            raise Conflict(f"Release {locked.pk} is {locked.state}.", code="release_closed")
        if not (getattr(actor, "is_superuser", False)
                and selectors.release_rule(locked)["admins_may_skip"]):
            raise PermissionDenied("Only a platform admin may skip approvals, where the "
                                   "environment's rule allows it.", code="skip_not_allowed")
        locked.skipped_by, locked.skip_reason = actor, reason.strip()
        locked.save(update_fields=["skipped_by", "skip_reason", "updated_at"])
        _audit(actor, Action.RELEASE_SKIP, locked, env,
               f"Approvals of release {locked.pk} skipped: {reason.strip()}",
               reason=reason.strip())
    return locked


def release_withdraw(*, release: ReleaseRequest, actor) -> ReleaseRequest:
    with transaction.atomic():
        env = Environment.objects.lock(release.environment_id)
        locked = locked_release(release.pk)
        if locked.state not in (ReleaseRequest.State.OPEN, ReleaseRequest.State.REJECTED):
            raise Conflict(f"Release {locked.pk} is {locked.state}.", code="release_closed")
        locked.state = ReleaseRequest.State.WITHDRAWN
        locked.save(update_fields=["state", "updated_at"])
        _audit(actor, Action.RELEASE_WITHDRAW, locked, env, f"Release {locked.pk} withdrawn")
    return locked
