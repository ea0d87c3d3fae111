"""The release rules, pure: when a new snapshot becomes the active one."""

from apps.snapshots.rules import Outcome


def publication_activates(*, outcome: Outcome | None, is_rollback: bool,
                          require_activation: bool, rollout_active: bool,
                          quarantined: bool = False) -> bool:
    """A new ready snapshot becomes active at once unless the environment requires
    an explicit activation (a rollback is that explicit act) or a rollout is
    active: then the rollout decides what becomes active. Quarantined content
    (what a rollout rolled back) is stored, flagged, and never activated by itself."""
    return (outcome == Outcome.NEW and (is_rollback or not require_activation)
            and not rollout_active and not quarantined)
