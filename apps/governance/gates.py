"""The release gate: one function, `release_gate`, that every path making a snapshot
desired by agents passes inside its caller's transaction with the environment
locked — activation, pushes, pins to other content than the active, rollout
creation and wave advances, environment rollbacks, and what calls them (scheduled
starts, a held publication's confirmation, the API, dashboard, admin and CLI).
It refuses, in order: a freeze (409 frozen), a degenerate render not confirmed
(409 confirmation_required), content not approved in a governed environment
(409 approval_required), each naming what is missing. An approved release is used
in the transaction of the outcome it authorises, never before: a rollback's
request checks the gate (`use=False`) and its render, storing and activating the
new snapshot, passes it again and uses the release (apps.releases.publishing).
Reconcile asks `freeze_in_force` and waits instead."""

from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict
from apps.environments.models import Environment
from apps.governance import rules, selectors
from apps.governance.models import ReleaseRequest
from apps.snapshots.guard import content_was_active, refuse_degenerate
from apps.snapshots.models import Snapshot


def refuse_frozen(environment: Environment, what: str, at=None) -> None:
    """409 frozen when a freeze holds releases of the environment now (or it is
    outside its allow windows), naming the window and until when."""
    hold = selectors.freeze_in_force(environment, at)
    if hold is not None:
        raise Conflict(f"{environment.full_name} is frozen: {rules.describe_hold(hold)}; no "
                       f"{what} starts now. An owner may override in an emergency, with a "
                       "reason.", code="frozen", details=hold)


# What the release gate refuses with: a refusal a publication can be held for.
REFUSALS = frozenset({"frozen", "confirmation_required", "approval_required"})


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
                      actor, what: str, use: bool = True) -> None:
    """409 approval_required unless this content is approved; when it is and `use`,
    its release is used up (it started), audited as release.use."""
    missing = approval_required(environment, snapshot, plan)
    if missing is not None:
        if missing.get("missing") == "release":
            why = (f"no approved release of #{snapshot.number} by "
                   f"{rules.describe_plan(plan)}: ask for approval of exactly this plan")
            if what == "rollback":
                why = (f"#{snapshot.number}'s content was never active here, so rolling "
                       f"back to it is a release: ask for approval of activating "
                       f"#{snapshot.number} (the rollback re-renders it)")
        elif "required" in missing:
            why = (f"release {missing['release']} has {missing['given']} of "
                   f"{missing['required']} approval(s)"
                   + (", and was rejected" if missing["rejected_by"] else ""))
        else:
            why = missing["missing"]
        raise Conflict(f"{environment.full_name} needs approval before this {what}: {why}.",
                       code="approval_required", details=missing)
    release = selectors.release_for(environment.pk, snapshot, plan) if use else None
    if release is not None:
        release_use(release=release, actor=actor, what=what)


def release_use(*, release: ReleaseRequest, actor, what: str) -> None:
    """Mark an approved release as released: it started, and is not used again.
    Only inside the transaction that writes what it authorises (the activation,
    pushes, pin, rollout): if that fails, the release stays open and approved."""
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


def release_gate(*, environment: Environment, snapshot: Snapshot, plan: dict | None, actor,
                 what: str, confirmed: bool = False, restores: bool = False,
                 use: bool = True) -> None:
    """The one gate of every path that makes `snapshot` desired by agents, in order:
    no freeze holds it (409 frozen); its render is not degenerate against the active
    snapshot unless `confirmed` (409 confirmation_required); in a governed environment
    exactly this content and `plan` are approved (409 approval_required; the release
    is used up). `restores` (an environment rollback): content that has been the
    environment's active content needs no new approval. `plan` None: a step of a
    release that started (a wave advance): its render and approval were checked
    when it started and the active snapshot cannot change during a rollout, so only
    a freeze holds it. `use` False: check only — the outcome is written later, in a
    transaction that passes the gate again (a rollback's render)."""
    refuse_frozen(environment, what)
    if plan is None:
        return
    refuse_degenerate(environment, snapshot, confirmed=confirmed)
    if restores and content_was_active(environment.pk, snapshot.checksum):
        return
    refuse_unapproved(environment=environment, snapshot=snapshot, plan=plan, actor=actor,
                      what=what, use=use)
