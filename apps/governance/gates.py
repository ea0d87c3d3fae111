"""The gates every release path passes, inside its caller's transaction with the
environment locked: activation, pushes and rollout creation ask `refuse_unapproved`
and `refuse_frozen`; a wave advance asks `refuse_frozen` (reconcile asks
`freeze_in_force` and waits instead). Refusals are 409 approval_required / frozen,
their details naming what is missing."""

from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict
from apps.environments.models import Environment
from apps.governance import rules, selectors
from apps.governance.models import ReleaseRequest
from apps.snapshots.models import Snapshot


def refuse_frozen(environment: Environment, what: str, at=None) -> None:
    """409 frozen when a freeze holds releases of the environment now (or it is
    outside its allow windows), naming the window and until when."""
    hold = selectors.freeze_in_force(environment, at)
    if hold is not None:
        raise Conflict(f"{environment.full_name} is frozen: {rules.describe_hold(hold)}; no "
                       f"{what} starts now. An owner may override in an emergency, with a "
                       "reason.", code="frozen", details=hold)


def approval_required(environment: Environment, snapshot: Snapshot, plan: dict) -> dict | None:
    """What is missing before `snapshot` may be released by `plan` in the environment,
    or None: nothing in an ungoverned environment; else an open release of exactly
    this content (snapshot checksum and plan) with the approvals its rule needs."""
    if not selectors.is_governed(environment.pk):
        return None
    release = selectors.release_for(environment.pk, snapshot, plan)
    if release is None:
        others = list(ReleaseRequest.objects.filter(
            environment=environment, snapshot=snapshot, state=ReleaseRequest.State.OPEN)
            .values_list("pk", flat=True)[:10])
        return {"missing": "release", "snapshot": snapshot.number,
                "plan_digest": rules.plan_digest(plan), "plan": plan,
                "releases_of_other_plans": others}
    return selectors.approval_missing(release)


def refuse_unapproved(*, environment: Environment, snapshot: Snapshot, plan: dict,
                      actor, what: str) -> None:
    """409 approval_required unless this content is approved; when it is, its release
    is used up (it started), audited as release.use."""
    missing = approval_required(environment, snapshot, plan)
    if missing is not None:
        if missing.get("missing") == "release":
            why = (f"no approved release of #{snapshot.number} by "
                   f"{rules.describe_plan(plan)}: ask for approval of exactly this plan")
        elif "required" in missing:
            why = (f"release {missing['release']} has {missing['given']} of "
                   f"{missing['required']} approval(s)"
                   + (", and was rejected" if missing["rejected_by"] else ""))
        else:
            why = missing["missing"]
        raise Conflict(f"{environment.full_name} needs approval before this {what}: {why}.",
                       code="approval_required", details=missing)
    release = selectors.release_for(environment.pk, snapshot, plan)
    if release is not None:
        release_use(release=release, actor=actor, what=what)


def release_use(*, release: ReleaseRequest, actor, what: str) -> None:
    """Mark an approved release as released: it started, and is not used again."""
    locks.require_transaction()
    locked = locks.lock_one(ReleaseRequest.objects, pk=release.pk)
    locked.state, locked.released_at = ReleaseRequest.State.RELEASED, timezone.now()
    locked.save(update_fields=["state", "released_at", "updated_at"])
    environment = release.environment
    audit_record(actor=actor, action=Action.RELEASE_USE, obj=locked, environment=environment,
                 tenant=environment.application.tenant,
                 summary=f"Release {locked.pk} started: {what} of #{release.snapshot.number}",
                 data={"what": what, "checksum": locked.checksum,
                       "plan_digest": locked.plan_digest})


def release_gate(*, environment: Environment, snapshot: Snapshot, plan: dict, actor,
                 what: str) -> None:
    """Both gates of a release's start, in order: no freeze holds it (409 frozen), and
    exactly this content is approved (409 approval_required)."""
    refuse_frozen(environment, what)
    refuse_unapproved(environment=environment, snapshot=snapshot, plan=plan, actor=actor,
                      what=what)


def direct_activation_held(environment: Environment) -> bool:
    """Whether a new snapshot is stored rather than activated by the direct release
    policy: in a governed environment an approved release starts it; during a
    freeze nothing does."""
    return (selectors.is_governed(environment.pk)
            or selectors.freeze_in_force(environment) is not None)
