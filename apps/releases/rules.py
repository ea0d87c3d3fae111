"""The release rules, pure: when a new snapshot becomes the active one."""

from apps.snapshots.rules import Outcome

DIRECT, STAGED = "direct", "staged"  # apps.environments.models.Environment.ReleasePolicy


def publication_activates_by_policy(*, release_policy: str, is_rollback: bool) -> bool:
    """What a publication is meant to do, known when it is requested: in a direct
    environment publishing activates; in a staged one it stores, and a rollout or
    an explicit activation releases it. A rollback is that explicit act."""
    return is_rollback or release_policy == DIRECT


def publication_activates(*, outcome: Outcome | None, is_rollback: bool,
                          release_policy: str, rollout_active: bool,
                          quarantined: bool = False) -> bool:
    """A new ready snapshot is to become active at once when the release policy
    says so, unless a rollout is active (then the rollout decides what becomes
    active) or its content is quarantined (what a rollout rolled back is stored,
    flagged, and never activated by itself). The release gate has the last word
    (approvals, a freeze: apps.releases.publishing)."""
    return (outcome == Outcome.NEW
            and publication_activates_by_policy(release_policy=release_policy,
                                                is_rollback=is_rollback)
            and not rollout_active and not quarantined)


def approval_hold(*, environment: str, number: int, release: int,
                  missing: dict | None) -> dict:
    """What a direct publish in a governed environment holds: {code, message,
    details} naming the release that asks to activate snapshot `number` and what
    it lacks (approval_missing)."""
    lacks = ("approved" if missing is None
             else f"{missing['given']} of {missing['required']} approval(s)"
             if "required" in missing else missing["missing"])
    return {"code": "approval_required",
            "message": f"{environment} needs approval before #{number} is activated: "
                       f"release {release} asks to activate it ({lacks}). Once it is "
                       f"approved, activate #{number} (or schedule release {release}).",
            "details": {"release": release, "url": f"/api/v1/releases/{release}",
                        "snapshot": number, **(missing or {})}}


RELEASED_BY = ["rollout", "activation"]


def release_note(*, release_policy: str, activates: bool, activated: bool | None,
                 state: str, snapshot_active: bool, held: dict | None = None) -> dict:
    """What a publication says about activation: {"released_by", "note"}.
    `released_by` names what releases its stored, not active snapshot ("rollout",
    "activation"); empty when it is active or there is nothing to release. `held`:
    the release gate's refusal when it was stored (approvals needed, a freeze)."""
    if activated is None:
        if state != "rendering":  # finished before publications recorded it
            return {"released_by": [] if snapshot_active else RELEASED_BY, "note": ""}
        return {"released_by": [] if activates else RELEASED_BY,
                "note": f"Rendering; the {release_policy} release policy "
                        + ("activates the new snapshot if the release gate lets it "
                           "(in a governed environment it asks for approval instead)."
                           if activates
                           else "stores it: a rollout or an explicit activation releases it.")}
    if activated:
        return {"released_by": [], "note": "Activated: agents following the environment get "
                                           "it at their next poll."}
    if state != "ready":
        return {"released_by": [], "note": f"Not activated: the publication is {state}."}
    if snapshot_active:
        return {"released_by": [], "note": "Nothing new to activate: that snapshot is the "
                                           "active one."}
    if held:
        return {"released_by": RELEASED_BY, "note": f"Stored, not activated: {held['message']}"}
    why = ("the release policy is staged" if not activates
           else "a rollout was active, or its content is quarantined")
    return {"released_by": RELEASED_BY,
            "note": f"Stored, not activated ({why}): start a rollout of it, or activate it."}
