"""Reads about snapshots: the source to render, preview, lookups, diffs, stale
publications and the changes waiting to roll out."""

import hashlib
import json
import logging
import threading
from datetime import timedelta

from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict, NotFound, Unavailable, ValidationFailed
from apps.environments.models import Environment
from apps.environments.selectors import current_policy, environment_limits
from apps.snapshots.models import Publication, Snapshot
from configlang.diff import diff_files
from configlang.isolated import render_isolated
from configlang.merge import merge
from configlang.problems import Problem
from configlang.rendering import SOURCE_FORMAT, Rendered, render_source
from configlang.yamlconfig import load_config


def render_source_for(environment: Environment) -> dict:
    """Every input of a render, captured now, so it can be replayed later."""
    return {
        "format": SOURCE_FORMAT,
        "application": environment.application.name,
        "environment": environment.name,
        "config": environment.config,
        "config_schema": environment.config_schema,
        "templates": [
            {"path": t.path, "source": t.source}
            for t in environment.templates.order_by("path")
        ],
        "fallback_files": [
            {"path": f.path, "content": f.content}
            for f in environment.fallback_files.order_by("path")
        ],
        "limits": environment_limits(environment),
        "policy": current_policy(),
        "tenant_restrictions": environment.application.tenant.restrictions,
        "descriptor": None,
    }


logger = logging.getLogger(__name__)

# --- renders in a web request ----------------------------------------------------------

LIMITED_RENDER_TTL_S = 300
_slots: dict[tuple, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


def _web_slots(tenant_id: int | None = None) -> threading.BoundedSemaphore:
    """The tenant's own renders in this process (BELLWETHER_WEB_RENDERS); None:
    every tenant's together (BELLWETHER_WEB_RENDERS_TOTAL), a safety cap one
    tenant cannot reach alone."""
    size = (settings.BELLWETHER_WEB_RENDERS_TOTAL if tenant_id is None
            else settings.BELLWETHER_WEB_RENDERS)
    with _slots_lock:
        return _slots.setdefault((tenant_id, size), threading.BoundedSemaphore(size))


def _acquire(slots: threading.BoundedSemaphore) -> None:
    if not slots.acquire(timeout=0.1):
        raise Unavailable("Too many renders are running; try again shortly.",
                          code="render_busy")


def _source_key(source: dict) -> str:
    canonical = json.dumps(source, sort_keys=True, ensure_ascii=False, default=str)
    return "render-limit:" + hashlib.sha256(canonical.encode()).hexdigest()


def _cached_limit(key: str) -> dict | None:
    try:
        return cache.get(key)
    except Exception:  # a cache outage only costs the render
        logger.warning("cache unavailable; rendering without it", exc_info=True)
        return None


WEB_RENDER_GRACE_SECONDS = 1  # a web render's child is killed this long after its deadline


def _render(source: dict, seconds: float) -> Rendered:
    """In a child process (configlang.isolated) unless BELLWETHER_RENDER_ISOLATED is
    off: C-level work a template triggers cannot be interrupted, and would otherwise
    hold this server's GIL past any deadline."""
    if settings.BELLWETHER_RENDER_ISOLATED:
        return render_isolated(source, seconds=seconds,
                               memory_bytes=settings.BELLWETHER_RENDER_MEMORY_MB << 20,
                               grace=WEB_RENDER_GRACE_SECONDS)
    return render_source(source, seconds=seconds)


def web_render(source: dict, *, tenant_id: int) -> Rendered:
    """Render for a web request (isolated as a publish is): within
    BELLWETHER_WEB_RENDER_SECONDS, at most BELLWETHER_WEB_RENDERS of the tenant's
    at once in this process (another answers 503 render_busy at once); a render
    its time limit stopped is 503 render_timeout (render_timed_out). Sources
    that went over the render budget by their own doing (operations, sizes; not a
    deadline or a stopped child, which the server's load decides) are remembered
    for a while, so asking again costs nothing."""
    key = _source_key(source)
    limited = _cached_limit(key)
    if limited is not None:
        return Rendered(effective_config={}, problems=[Problem(**limited)])
    tenant_slots, all_slots = _web_slots(tenant_id), _web_slots()
    _acquire(tenant_slots)
    try:
        _acquire(all_slots)
        try:
            rendered = _render(source, settings.BELLWETHER_WEB_RENDER_SECONDS)
        finally:
            all_slots.release()
    finally:
        tenant_slots.release()
    if rendered.timed_out:
        raise render_timed_out(rendered)
    for problem in rendered.problems if not rendered.load_dependent else ():
        if problem.code == "render_limit":
            try:
                cache.set(key, problem.as_dict(), LIMITED_RENDER_TTL_S)
            except Exception:
                logger.warning("cache unavailable; not remembering a limited render")
    return rendered


RENDER_TIMEOUT_RETRY_S = 5


def render_timed_out(rendered: Rendered) -> Unavailable:
    """503 render_timeout (Retry-After) for a web render stopped by wall time (its
    deadline, a child stopped or not started in time): the server's load decided
    that, not the template, which operations and sizes bound (400 render_limit).
    The details name the template and line where it stopped."""
    stopped = next(p for p in rendered.problems if p.code == "render_limit")
    error = Unavailable("The server is busy: the render was stopped by its time limit "
                        f"({stopped.message}); try again shortly.",
                        code="render_timeout", details=[p.as_dict() for p in rendered.problems])
    error.retry_after = RENDER_TIMEOUT_RETRY_S
    return error


def refuse_render_limit(problems: list) -> None:
    """400 render_limit when a render's problems (Problem or its dict) say it went
    over its budget, naming the template and line: a web request answers that,
    not a result."""
    for problem in problems:
        found = problem.as_dict() if isinstance(problem, Problem) else problem
        if found["code"] == "render_limit":
            raise ValidationFailed(f"The render went over its budget: {found['message']}",
                                   code="render_limit", details=[found])


def snapshot_preview(environment: Environment) -> Rendered:
    """Render the current config (a web render); records nothing."""
    return web_render(render_source_for(environment),
                      tenant_id=environment.application.tenant_id)


def latest_ready_snapshot(environment: Environment) -> Snapshot | None:
    return (
        Snapshot.objects.filter(environment=environment, state=Snapshot.State.READY)
        .order_by("-number")
        .first()
    )


def snapshot_get(*, environment: Environment, number: int) -> Snapshot:
    snapshot = Snapshot.objects.filter(environment=environment, number=number).first()
    if snapshot is None:
        raise NotFound(f"Snapshot {number} of {environment.full_name} not found.")
    return snapshot


def snapshot_diff(*, snapshot: Snapshot, against: int | None = None) -> dict:
    """Per-file diff of `snapshot` against another of its environment (default: the
    previous ready one). Invalid snapshots have no files, so they cannot be compared."""
    if not snapshot.is_ready:
        raise Conflict(f"Snapshot {snapshot.number} is invalid and has no files to compare.",
                       code="snapshot_invalid")
    if against is None:
        base = (
            Snapshot.objects.filter(environment_id=snapshot.environment_id,
                                    number__lt=snapshot.number, state=Snapshot.State.READY)
            .order_by("-number")
            .first()
        )
    else:
        if against < 1:
            raise ValidationFailed("against must be a snapshot number (1 or more).")
        base = snapshot_get(environment=snapshot.environment, number=against)
        if not base.is_ready:
            raise Conflict(f"Snapshot {against} is invalid and has no files to compare.",
                           code="snapshot_invalid")
    return {
        "snapshot": snapshot.number,
        "against": base.number if base else None,
        "files": diff_files(base.files if base else [], snapshot.files),
    }


def descriptor_source(environment: Environment, descriptor: dict) -> dict:
    """The environment's inputs with an app team's descriptor. Refused (400) when
    the layers do not merge, naming every error's layer, key and values."""
    source = {**render_source_for(environment), "descriptor": descriptor}
    config, problems = load_config(source["config"], limits=source["limits"])
    if problems:
        raise ValidationFailed(f"{environment.full_name}'s own config does not parse: "
                               f"{problems[0]}", code="config_invalid",
                               details=[p.as_dict() for p in problems])
    merged = merge(environment=config, policy=source["policy"]["content"],
                   tenant=source["tenant_restrictions"], descriptor=descriptor,
                   application=environment.application.name, environment_name=environment.name)
    if merged.errors:
        raise ValidationFailed(
            f"The descriptor does not merge: {len(merged.errors)} error(s); first: "
            f"{merged.errors[0]}", code="merge_conflict",
            details=[e.as_dict() for e in merged.errors])
    return source


def descriptor_dry_run(environment: Environment, descriptor: dict) -> dict:
    """What submitting `descriptor` would publish; records nothing. 400
    render_limit when the render goes over its budget."""
    rendered = web_render(descriptor_source(environment, descriptor),
                          tenant_id=environment.application.tenant_id)
    refuse_render_limit(rendered.problems)
    active = environment.active_snapshot
    return {
        "valid": rendered.is_valid,
        "errors": [p.as_dict() for p in rendered.problems],
        "effective_config": rendered.effective_config,
        "provenance": rendered.provenance,
        "files": rendered.files,
        "diff": diff_files(active.files if active else [], rendered.files),
        "against": active.number if active else None,
    }


def stale_publication_ids(*, unclaimed_after: timedelta, claim_lifetime: timedelta) -> list:
    """Publications whose render is lost: still rendering and unclaimed
    `unclaimed_after` after they were queued (the message was lost or never sent),
    or claimed longer ago than a render may run (the worker died)."""
    now = timezone.now()
    return list(Publication.objects.filter(state=Publication.State.RENDERING).filter(
        Q(claimed_at__isnull=True, created_at__lt=now - unclaimed_after)
        | Q(claimed_at__lt=now - claim_lifetime)
    ).order_by("created_at").values_list("pk", flat=True))


# --- pending changes ---------------------------------------------------------------


def _pending_boundary():
    """The audit id up to which an environment's latest ready snapshot holds every
    input change, as an expression over Environment rows (0: nothing published).
    Delimited by audit id, never by time: the newest request that produced or
    matched that snapshot (a deduplicated publish confirms the snapshot holds
    everything up to its own request)."""
    def latest(environment):
        return (Snapshot.objects.filter(environment=environment, state=Snapshot.State.READY)
                .order_by("-number"))

    confirmed = (Publication.objects
                 .filter(snapshot=Subquery(latest(OuterRef(OuterRef("pk"))).values("pk")[:1]),
                         state=Publication.State.READY)
                 .order_by().values("snapshot").annotate(newest=Max("inputs_audit_id"))
                 .values("newest"))
    return Coalesce(Subquery(confirmed[:1]),
                    Subquery(latest(OuterRef("pk")).values("inputs_audit_id")[:1]), 0)


def with_pending_counts(environments):
    """`environments` annotated with pending_count: how many input changes wait to
    roll out (one query for any number of environments; nothing is rendered)."""
    waiting = (AuditEvent.objects.render_inputs()
               .filter(environment=OuterRef("pk"), id__gt=OuterRef("pending_boundary"))
               .order_by().values("environment").annotate(n=Count("pk")).values("n"))
    return (environments.annotate(pending_boundary=_pending_boundary())
            .annotate(pending_count=Coalesce(Subquery(waiting), 0)))


def content_authors(environment: Environment, snapshot: Snapshot) -> set[int]:
    """Who wrote `snapshot`'s change against what the environment runs: the users
    whose input changes (config, schema, templates, fallback files) it holds and
    the active snapshot does not — every change it holds when nothing is active.
    Delimited by audit id, as pending changes are."""
    upto = snapshot.inputs_audit_id
    if upto is None:
        return set()
    since = environment.active_snapshot_id and (
        Snapshot.objects.filter(pk=environment.active_snapshot_id)
        .values_list("inputs_audit_id", flat=True).first())
    return set(AuditEvent.objects.render_inputs().filter(
        environment_id=environment.pk, id__gt=since or 0, id__lte=upto, actor__isnull=False)
        .values_list("actor_id", flat=True).distinct())


def pending_events(environment: Environment):
    """The latest ready snapshot and the input changes it does not contain."""
    boundary = (Environment.objects.filter(pk=environment.pk)
                .annotate(boundary=_pending_boundary()).values_list("boundary", flat=True)
                .get())
    events = AuditEvent.objects.render_inputs().filter(environment=environment,
                                                       id__gt=boundary)
    return latest_ready_snapshot(environment), events


def pending_changes(environment: Environment) -> dict:
    """The pending events (since the latest ready snapshot) and the diff of
    rendering now against the active snapshot — what agents run — or, when none is
    active, against the latest ready one. `checksum` is the rendered content's."""
    latest, events = pending_events(environment)
    base = environment.active_snapshot or latest
    rendered = snapshot_preview(environment)
    return {
        "snapshot": latest,
        "active": environment.active_snapshot,
        "against": base,
        "events": list(events.select_related("actor").order_by("id")),
        "valid": rendered.is_valid,
        "errors": [p.as_dict() for p in rendered.problems],
        "checksum": rendered.checksum if rendered.is_valid else None,
        "files": diff_files(base.files if base else [], rendered.files)
        if rendered.is_valid
        else [],
    }
