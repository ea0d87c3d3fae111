"""Drift: managed files on an agent's host that no longer match the snapshot it
applied (a hand edit), as the agent reports them (POST /api/v1/agent/drift).

The agent compares the files on disk with what it wrote and reports the drifted
set only when it changes; a successful apply report clears it
(apps.fleet.rules.report_changes). What a report changes is
apps.fleet.rules.drift_changes; it never reaches the agent's desired state, so
it makes no poll answer stale.
"""

import logging

from django.db import transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core.errors import ValidationFailed
from apps.core.events import announce, emit
from apps.fleet import rules
from apps.fleet.models import Agent
from apps.snapshots.models import Snapshot

logger = logging.getLogger(__name__)

MAX_DRIFT_FILES = 1000
MAX_DRIFT_PATH = 255  # a snapshot's file paths are at most this long (EnvironmentFile.path)
DRIFT_CHANGES = ("modified", "missing", "mode")
MAX_SUMMARY = 200
# The audit event names at most this many paths and their count (the agent row
# keeps them all): a body switching between two large sets writes small rows.
AUDITED_PATHS = 20


def _summary(agent: Agent, files: list, restored: bool) -> str:
    if not files:
        return f"{agent} no longer drifted from #{agent.applied_number}"
    paths = ", ".join(f["path"] for f in files[:5]) + (
        f" and {len(files) - 5} more" if len(files) > 5 else "")
    return (f"{agent}: {len(files)} managed file(s) drifted from #{agent.applied_number}"
            f"{' (restored)' if restored else ''}: {paths}")


MAX_DETAILS = 20


def _managed_paths(agent: Agent, number: int) -> set:
    """The paths of the files (and safe fallback files) of the agent's environment's
    snapshot #number: the only files the agent writes, so the only ones that drift."""
    found = (Snapshot.objects.filter(environment_id=agent.environment_id, number=number)
             .values_list("files", "fallback_files").first())
    if found is None:
        return set()
    return {entry["path"] for entries in found for entry in entries or ()}


def agent_drift_record(*, agent: Agent, number: int, checksum: str, files: list,
                       restored: bool) -> bool:
    """Record the agent's report of drifted files (`files` checked by the caller:
    [{path, change, summary}], empty when no longer drifted) against the snapshot it
    applied (409 not_applied otherwise). Returns whether anything changed: an
    identical repeat is not recorded, audited or announced again."""
    with transaction.atomic():
        locked = Agent.objects.lock(agent.pk)
        refused = rules.drift_refusal(locked, number=number, checksum=checksum)
        if refused is not None:
            raise refused
        unknown = rules.drift_unknown_paths(files, _managed_paths(locked, number))
        if unknown:
            raise ValidationFailed(f"{unknown[0]['field']}: {unknown[0]['message']}",
                                   details=unknown[:MAX_DETAILS])
        changes = rules.drift_changes(locked, files=files, restored=restored,
                                      now=timezone.now())
        if not changes:
            return False
        for field, value in changes.items():
            setattr(locked, field, value)
        locked.save(update_fields=list(changes))
        audit_record(actor=None, action=Action.AGENT_DRIFT, obj=locked,
                     environment=locked.environment, summary=_summary(locked, files, restored),
                     data={"snapshot": number, "restored": restored,
                           "paths": [f["path"] for f in files[:AUDITED_PATHS]],
                           "files": len(files)})
        emit("agent", environment_id=locked.environment_id, id=locked.pk)
        announce("drift.reported", environment_id=locked.environment_id, agent=locked.pk,
                 name=locked.name, snapshot=number, restored=restored,
                 files=[f["path"] for f in files[:AUDITED_PATHS]], drifted=bool(files))
    logger.info("agent %s: %d drifted file(s)%s", locked.name, len(files),
                " (restored)" if restored else "")
    return True
