"""The degenerate-render guard (a snapshot that, against what the environment's
agents run, empties a file or shrinks sharply) and the record of the content an
environment has run: what the release gate (apps.governance.gates) asks."""

from apps.core import locks
from apps.core.errors import Conflict
from apps.environments.models import Environment
from apps.snapshots.models import ActiveContent, Publication, Snapshot
from apps.snapshots.rules import confirmation_details, degenerate_render, degenerate_summary


class ConfirmationRequired(Conflict):
    """A degenerate render needs an explicit confirmation (the API's `confirm`)."""

    def __init__(self, findings: dict):
        super().__init__(
            f"Against the active #{findings['against']}: {degenerate_summary(findings)}. "
            "Confirm to release it (confirm: true).", code="confirmation_required",
            details=confirmation_details(findings))


def degenerate_findings(environment: Environment, files: list[dict]) -> dict | None:
    """The degenerate-render guard: `files` against what the environment's agents
    run (its active snapshot), {against, emptied, shrink}; None when fine."""
    active = environment.active_snapshot
    if active is None:
        return None
    findings = degenerate_render(before=active.files, after=files,
                                 threshold_percent=environment.shrink_threshold_percent)
    return None if findings is None else {"against": active.number, **findings}


def refuse_degenerate(environment: Environment, snapshot: Snapshot, *,
                      confirmed: bool) -> None:
    """409 confirmation_required naming the emptied files and the shrink, unless
    `confirmed` or a confirmed publication produced `snapshot`."""
    findings = None if confirmed else degenerate_findings(environment, snapshot.files)
    if findings is None or Publication.objects.filter(snapshot=snapshot,
                                                      confirmed=True).exists():
        return
    raise ConfirmationRequired(findings)


def content_activated(environment: Environment, snapshot: Snapshot) -> None:
    """Record that `snapshot`'s content (its checksum) is the environment's active
    content now (inside the transaction that activates it, the environment locked)."""
    locks.require_transaction()
    ActiveContent.objects.bulk_create(
        [ActiveContent(environment=environment, checksum=snapshot.checksum,
                       first_number=snapshot.number)], ignore_conflicts=True)


def content_was_active(environment_id: int, checksum: str) -> bool:
    """Whether content with `checksum` has been the environment's active content."""
    return bool(checksum) and ActiveContent.objects.filter(
        environment_id=environment_id, checksum=checksum).exists()
