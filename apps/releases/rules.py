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
                          quarantined: bool = False, governance_holds: bool = False) -> bool:
    """A new ready snapshot becomes active at once when the release policy says
    so, unless a rollout is active (then the rollout decides what becomes active)
    or its content is quarantined (what a rollout rolled back is stored, flagged,
    and never activated by itself), or governance holds it (an environment that needs
    approvals, or a freeze: apps.governance.gates.direct_activation_held)."""
    return (outcome == Outcome.NEW
            and publication_activates_by_policy(release_policy=release_policy,
                                                is_rollback=is_rollback)
            and not rollout_active and not quarantined and not governance_holds)


RELEASED_BY = ["rollout", "activation"]


def release_note(*, release_policy: str, activates: bool, activated: bool | None,
                 state: str, snapshot_active: bool) -> dict:
    """What a publication says about activation: {"released_by", "note"}.
    `released_by` names what releases its stored, not active snapshot ("rollout",
    "activation"); empty when it is active or there is nothing to release."""
    if activated is None:
        if state != "rendering":  # finished before publications recorded it
            return {"released_by": [] if snapshot_active else RELEASED_BY, "note": ""}
        return {"released_by": [] if activates else RELEASED_BY,
                "note": f"Rendering; the {release_policy} release policy "
                        + ("activates the new snapshot." if activates
                           else "stores it: a rollout or an explicit activation releases it.")}
    if activated:
        return {"released_by": [], "note": "Activated: agents following the environment get "
                                           "it at their next poll."}
    if state != "ready":
        return {"released_by": [], "note": f"Not activated: the publication is {state}."}
    if snapshot_active:
        return {"released_by": [], "note": "Nothing new to activate: that snapshot is the "
                                           "active one."}
    why = ("the release policy is staged" if not activates
           else "a rollout was active, its content is quarantined, or governance holds "
                "it: approvals needed or a freeze")
    return {"released_by": RELEASED_BY,
            "note": f"Stored, not activated ({why}): start a rollout of it, or activate it."}
