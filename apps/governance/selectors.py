"""Governance reads: the rule of an environment, what a release still lacks
(`approval_missing`), the release that covers some content, and whether a freeze
holds releases at a moment (`freeze_in_force`)."""

from datetime import datetime

from django.utils import timezone

from apps.environments.models import Environment
from apps.environments.selectors import environment_role
from apps.governance import rules
from apps.governance.models import (
    ApprovalRule,
    FreezeOverride,
    ReleaseRequest,
    ReleaseWindow,
)
from apps.snapshots.models import Snapshot
from apps.snapshots.selectors import content_authors
from apps.tenancy.models import Role


def rule_of(environment_id: int) -> dict:
    """The environment's approval rule now, in the form a release records."""
    rule = (ApprovalRule.objects.filter(environment_id=environment_id)
            .prefetch_related("approver_groups").first())
    if rule is None:
        return rules.NO_RULE
    return rules.frozen_rule(required=rule.required_approvals,
                             owners_approve=rule.owners_approve,
                             groups=[g.name for g in rule.approver_groups.all()],
                             admins_may_skip=rule.admins_may_skip, strict=rule.strict,
                             version=rule.version)


def is_governed(environment_id: int) -> bool:
    """Whether releasing in the environment needs approvals now."""
    return ApprovalRule.objects.filter(environment_id=environment_id,
                                       required_approvals__gt=0).exists()


def release_rule(release: ReleaseRequest) -> dict:
    return rules.rule_in_force(submitted=release.rule, current=rule_of(release.environment_id))


def is_author(user, release: ReleaseRequest) -> bool:
    """Whether `user` wrote the content `release` asks to release: who asked, who
    published its snapshot, who changed its snapshot or plan since, or who changed
    an input the snapshot holds and the environment does not run yet."""
    return (user.pk in (release.requested_by_id, release.snapshot.author_id)
            or release.editors.filter(pk=user.pk).exists()
            or user.pk in content_authors(release.environment, release.snapshot))


def approver_refusal(*, user, release: ReleaseRequest, rule: dict | None = None) -> str | None:
    """Why `user` may not approve or reject `release`, or None."""
    rule = rule or release_rule(release)
    role = environment_role(user=user, environment=release.environment)
    return rules.approver_refusal(
        is_author=is_author(user, release), is_member=role is not None,
        is_owner=role == Role.OWNER,
        groups=set(user.groups.values_list("name", flat=True)), rule=rule)


def standing_decisions(release: ReleaseRequest, rule: dict) -> list[rules.Decision]:
    """The release's decisions not cancelled, each with whether its author may decide
    under `rule` (a strict rule may have changed who may)."""
    standing = release.approvals.filter(cancelled_at__isnull=True).select_related("approver")
    return [rules.Decision(approver=a.approver.get_username(), decision=a.decision,
                           comment=a.comment,
                           eligible=approver_refusal(user=a.approver, release=release,
                                                     rule=rule) is None)
            for a in standing]


def approval_missing(release: ReleaseRequest) -> dict | None:
    """What `release` lacks before it may start, or None: its state when it is no
    longer open, else the approvals it still needs under the rule in force."""
    if release.state != ReleaseRequest.State.OPEN:
        return {"release": release.pk, "state": release.state,
                "missing": f"release {release.pk} is {release.state}"}
    rule = release_rule(release)
    missing = rules.approvals_missing(rule=rule, decisions=standing_decisions(release, rule),
                                      skipped=release.skipped_by_id is not None)
    return None if missing is None else {"release": release.pk, **missing}


def release_for(environment_id: int, snapshot: Snapshot, plan: dict) -> ReleaseRequest | None:
    """The open release of exactly this content: the snapshot (its checksum) and plan."""
    return (ReleaseRequest.objects.select_related("snapshot", "environment")
            .filter(environment_id=environment_id, snapshot=snapshot,
                    checksum=snapshot.checksum, plan_digest=rules.plan_digest(plan),
                    state=ReleaseRequest.State.OPEN).first())


def _as_rule(window: ReleaseWindow) -> rules.Window:
    return rules.Window(name=window.name, kind=window.kind, timezone=window.timezone,
                        starts_at=window.starts_at, ends_at=window.ends_at,
                        weekdays=tuple(window.weekdays or ()), start_time=window.start_time,
                        end_time=window.end_time)


def windows_of(environment_id: int, exclude: int | None = None) -> list[rules.Window]:
    return [_as_rule(w) for w in ReleaseWindow.objects.filter(environment_id=environment_id)
            .exclude(pk=exclude)]


def override_in_force(environment_id: int, at: datetime) -> FreezeOverride | None:
    return (FreezeOverride.objects.filter(environment_id=environment_id, starts_at__lte=at,
                                          ends_at__gt=at).order_by("-ends_at").first())


def freeze_in_force(environment: Environment | int, at: datetime | None = None) -> dict | None:
    """Why no activation, push or wave advance may start in the environment at `at`
    (now by default), or None: a freeze, or being outside its allow windows — unless
    an owner's emergency override is in force. Read at every check, never cached:
    a freeze added now holds the next step."""
    environment_id = getattr(environment, "pk", environment)
    at = at or timezone.now()
    windows = windows_of(environment_id)
    return rules.release_hold(
        freezes=[w for w in windows if w.kind == ReleaseWindow.Kind.FREEZE],
        allows=[w for w in windows if w.kind == ReleaseWindow.Kind.ALLOW], at=at,
        overridden=override_in_force(environment_id, at) is not None)


def release_status(release: ReleaseRequest) -> dict:
    """What the API and the dashboard show of a release's decisions."""
    rule = release_rule(release)
    return {"rule": rule, "missing": approval_missing(release),
            "decisions": [{"by": a.approver.get_username(), "decision": a.decision,
                           "comment": a.comment, "checksum": a.checksum,
                           "plan_digest": a.plan_digest, "at": a.created_at,
                           "cancelled_at": a.cancelled_at, "cancel_reason": a.cancel_reason}
                          for a in release.approvals.select_related("approver")]}
