"""The rules of snapshots, pure: what a finished publication becomes."""

from datetime import datetime
from enum import StrEnum


class Outcome(StrEnum):
    SUPERSEDED = "superseded"  # a later request already produced the newest snapshot
    DUPLICATE = "duplicate"  # identical to the latest ready snapshot: nothing new
    NEW = "new"  # a new ready snapshot
    INVALID = "invalid"  # a new invalid snapshot (its number is used up, it never runs)


def publication_outcome(*, inputs_audit_id: int | None, newest_inputs_audit_id: int | None,
                        is_valid: bool, is_plain_publish: bool,
                        content: tuple, latest_content: tuple | None) -> Outcome:
    """What a rendered publication becomes.

    `inputs_audit_id` orders requests by when their inputs were captured: one
    requested before the newest snapshot's request but finished after it would
    silently bring older inputs back, so it is superseded. A plain publish (not a
    rollback, not a descriptor: each release is frozen into a snapshot of its own)
    of exactly the latest ready content allocates nothing. `content` is what makes
    two snapshots the same: (checksum, fallback files).
    """
    if (newest_inputs_audit_id or 0) > (inputs_audit_id or 0):
        return Outcome.SUPERSEDED
    if not is_valid:
        return Outcome.INVALID
    if is_plain_publish and latest_content is not None and content == latest_content:
        return Outcome.DUPLICATE
    return Outcome.NEW


def publication_progress(*, is_rendering: bool, created_at: datetime,
                         claimed_at: datetime | None) -> str | None:
    """Where a publication's render stands, for people: no worker has taken it yet,
    or one is rendering it (None once it is finished). Times in UTC."""
    if not is_rendering:
        return None
    if claimed_at is None:
        return f"waiting for a worker since {created_at:%Y-%m-%d %H:%M:%S} UTC"
    return f"rendering since {claimed_at:%Y-%m-%d %H:%M:%S} UTC"
