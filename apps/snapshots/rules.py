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


def _size(files: list[dict]) -> int:
    return sum(len(f["content"].encode()) for f in files)


def degenerate_render(*, before: list[dict], after: list[dict],
                      threshold_percent: int) -> dict | None:
    """What makes a render look degenerate against the files agents run now
    (`before`): a file that had content and is now empty (or gone), or the files
    shrinking by `threshold_percent` or more (0: no shrink check) — the mark of a
    template tool that wrote empty files after its data source lost state. None
    when neither; else {"emptied": [paths], "shrink": {...} or None}."""
    now = {f["path"]: f["content"] for f in after}
    emptied = sorted(f["path"] for f in before if f["content"].strip()
                     and not now.get(f["path"], "").strip())
    old, new = _size(before), _size(after)
    percent = 0 if old == 0 else (old - new) * 100 // old
    shrink = ({"before_bytes": old, "after_bytes": new, "percent": percent,
               "threshold_percent": threshold_percent}
              if threshold_percent and old and percent >= threshold_percent else None)
    if not emptied and shrink is None:
        return None
    return {"emptied": emptied, "shrink": shrink}


def degenerate_summary(findings: dict) -> str:
    """One sentence naming the emptied files and the shrink, for people."""
    parts = []
    if findings["emptied"]:
        parts.append("emptied: " + ", ".join(findings["emptied"][:10])
                     + (" …" if len(findings["emptied"]) > 10 else ""))
    if findings["shrink"]:
        shrink = findings["shrink"]
        parts.append(f"files shrink {shrink['percent']}% ({shrink['before_bytes']} → "
                     f"{shrink['after_bytes']} bytes; the threshold is "
                     f"{shrink['threshold_percent']}%)")
    return "; ".join(parts)


def confirmation_details(findings: dict) -> list[dict]:
    """The 409 confirmation_required details: one per emptied file, and the shrink."""
    details = [{"file": path, "change": "emptied"} for path in findings["emptied"]]
    if findings["shrink"]:
        details.append({"change": "shrink", **findings["shrink"]})
    return details


def retention_excess(*, stored: list[tuple[int, int]], kept: set, max_count: int,
                     max_bytes: int) -> list[int]:
    """Which snapshots retention removes: `stored` is [(id, bytes)] oldest first,
    `kept` the ids nothing may remove. The oldest removable ones go until at most
    `max_count` snapshots and `max_bytes` bytes remain (or nothing more may go)."""
    count, total = len(stored), sum(size for _, size in stored)
    removed = []
    for pk, size in stored:
        if count <= max_count and total <= max_bytes:
            break
        if pk in kept:
            continue
        removed.append(pk)
        count, total = count - 1, total - size
    return removed
