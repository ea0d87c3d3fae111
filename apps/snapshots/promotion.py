"""Reads of a promotion: what staging runs, applied to production's own inputs.

A promotion takes the source environment's active snapshot — what its agents run —
and publishes, in the target environment, the target's own (authoritative) config,
schema, templates and fallback files with the release's descriptor (its version,
params and secrets) retargeted there. The source records where it came from
(`promoted_from`), and the render's provenance names it on every descriptor key.
"""

from apps.core.errors import Conflict, ValidationFailed
from apps.environments.models import Environment
from apps.snapshots.models import Snapshot
from apps.snapshots.selectors import (
    descriptor_source,
    refuse_render_limit,
    render_source_for,
    web_render,
)
from configlang.diff import diff_files


def promoted_snapshot(*, source: Environment, target: Environment,
                      expected_number: int | None = None) -> Snapshot:
    """What `source` runs (its active snapshot), to promote into `target`: only
    within one application (400 promotion_scope), never to itself; 409 when nothing
    is active there, or when it is no longer `expected_number` (stale)."""
    if source.application_id != target.application_id or source.pk == target.pk:
        raise ValidationFailed(
            f"{source.full_name} cannot be promoted to {target.full_name}: a promotion "
            "goes between two environments of one application.", code="promotion_scope",
            details=[{"field": "from", "message": "another environment of "
                      f"{target.application.name}"}])
    snapshot = source.active_snapshot
    if snapshot is None:
        raise Conflict(f"{source.full_name} has no active snapshot to promote.",
                       code="no_active_snapshot")
    if expected_number is not None and snapshot.number != expected_number:
        raise Conflict(f"{source.full_name} now runs #{snapshot.number}, not "
                       f"#{expected_number}.", code="stale",
                       details=[{"field": "number", "active": snapshot.number}])
    return snapshot


def promotion_source(environment: Environment, promoted: Snapshot) -> dict:
    """The render source of promoting `promoted` into `environment`: its own inputs,
    now, with the release's descriptor retargeted (400 when it does not merge)."""
    descriptor = promoted.source.get("descriptor")
    source = (descriptor_source(environment, {**descriptor, "environment": environment.name})
              if descriptor else render_source_for(environment))
    return {**source, "promoted_from": {
        "environment": promoted.environment.full_name, "number": promoted.number,
        "label": promoted.label, "checksum": promoted.checksum}}


def promotion_preview(*, environment: Environment, promoted: Snapshot) -> dict:
    """What promoting would publish, diffed against the environment's active
    snapshot; records nothing. 400 render_limit over the render budget."""
    rendered = web_render(promotion_source(environment, promoted),
                          tenant_id=environment.application.tenant_id)
    refuse_render_limit(rendered.problems)
    active = environment.active_snapshot
    return {
        "promoted_from": {"environment": promoted.environment.full_name,
                          "number": promoted.number, "label": promoted.label,
                          "checksum": promoted.checksum},
        "valid": rendered.is_valid,
        "errors": [p.as_dict() for p in rendered.problems],
        "checksum": rendered.checksum if rendered.is_valid else None,
        "provenance": rendered.provenance,
        "against": active.number if active else None,
        "files": diff_files(active.files if active else [], rendered.files)
        if rendered.is_valid else [],
        "rendered_files": rendered.files if rendered.is_valid else [],
    }
