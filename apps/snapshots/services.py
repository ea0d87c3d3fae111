"""Publishing and rolling back snapshots.

A publish captures the environment's inputs in a Publication under the
environment's row lock; a worker renders and validates them outside any lock,
then allocates the next number under the lock again. Identical content to the
latest ready snapshot allocates nothing and returns that snapshot.
"""

import json
import logging
from datetime import timedelta

from django.db import transaction
from django.utils import timezone

from apps.audit.services import audit_record
from apps.core.errors import Conflict
from apps.core.events import emit
from apps.environments.models import Environment
from apps.fleet.services import environment_activate, environment_has_active_rollout
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.problems import Problem
from apps.snapshots.rendering import Rendered, render_source
from apps.snapshots.selectors import latest_ready_snapshot, render_source_for

logger = logging.getLogger(__name__)


def _enqueue_render(publication: Publication) -> None:
    from apps.snapshots.tasks import publication_render_task

    publication_render_task.delay_on_commit(str(publication.pk))


def publication_create(*, environment: Environment, actor, kind: str, source: dict,
                       rolled_back_from: Snapshot | None = None) -> Publication:
    """Record a publish or rollback request and queue its render. Call with the
    environment locked: the request's audit event id orders it among others."""
    is_user = getattr(actor, "is_authenticated", False)
    publication = Publication(
        environment=environment, kind=kind, source=source,
        rolled_back_from=rolled_back_from, author=actor if is_user else None,
    )
    what = (f"a rollback to #{rolled_back_from.number}" if rolled_back_from
            else f"descriptor {source['descriptor']['id']}" if source.get("descriptor")
            else "a publish")
    event = audit_record(
        actor=actor, action="publication.create", obj=publication, environment=environment,
        tenant=environment.application.tenant,
        summary=f"Requested {what} of {environment.full_name}", data={"kind": kind},
    )
    publication.inputs_audit_id = event.pk
    publication.save()
    emit("pending", environment_id=environment.pk)
    logger.info("publication %s (%s) queued for %s", publication.pk, kind,
                environment.full_name)
    _enqueue_render(publication)
    return publication


def locked_environment(environment_id: int) -> Environment:
    return (Environment.objects.select_for_update(of=("self",))
            .select_related("application__tenant").get(pk=environment_id))


def snapshot_publish(*, environment: Environment, actor) -> Publication:
    """Capture the environment's current inputs and queue their render."""
    with transaction.atomic():
        locked = locked_environment(environment.pk)
        return publication_create(environment=locked, actor=actor,
                                  kind=Publication.Kind.PUBLISH, source=render_source_for(locked))


def snapshot_rollback(*, snapshot: Snapshot, actor) -> Publication:
    """Queue a new snapshot re-rendered from `snapshot`'s stored source."""
    if not snapshot.is_ready:
        raise Conflict(
            f"Snapshot {snapshot.number} is {snapshot.state}; only a ready snapshot "
            "can be rolled back to.",
            code="rollback_unavailable",
        )
    with transaction.atomic():
        locked = locked_environment(snapshot.environment_id)
        if environment_has_active_rollout(locked):
            raise Conflict(f"{locked.full_name} has an active rollout; roll that back instead.",
                           code="rollout_active")
        return publication_create(environment=locked, actor=actor,
                                  kind=Publication.Kind.ROLLBACK, source=snapshot.source,
                                  rolled_back_from=snapshot)


def publication_render(*, publication_id: str) -> Publication:
    """Render a queued publication and store its snapshot. Idempotent."""
    publication = Publication.objects.get(pk=publication_id)
    if publication.state != Publication.State.RENDERING:
        return publication
    try:
        rendered = render_source(publication.source)
    except Exception as exc:
        # A bug must not leave the publication rendering forever.
        logger.exception("rendering publication %s failed", publication_id)
        rendered = Rendered(effective_config={}, problems=[
            Problem("render_failed", f"internal error while rendering ({type(exc).__name__})")
        ])
    return publication_finish(publication_id=publication_id, rendered=rendered)


def publication_fail(*, publication_id: str, reason: str) -> Publication:
    """Finish a publication whose render could not complete (e.g. it timed out)."""
    return publication_finish(
        publication_id=publication_id,
        rendered=Rendered(effective_config={}, problems=[Problem("render_failed", reason)]),
    )


def _bundle(number: int, label: str, rendered: Rendered) -> bytes:
    """What an agent downloads, serialised once (DESIGN.md: bundles are immutable)."""
    return json.dumps({
        "number": number,
        "label": label,
        "checksum": rendered.checksum,
        "files": rendered.files,
        "fallback_files": rendered.fallback_files,
    }, ensure_ascii=False, separators=(",", ":")).encode()


def _label(environment: Environment, today) -> str:
    prefix = f"{today:%Y%m%d}-"
    taken = Snapshot.objects.filter(environment=environment, label__startswith=prefix).count()
    return f"{prefix}{taken + 1:03d}"


def publication_finish(*, publication_id: str, rendered: Rendered) -> Publication:
    environment_id = Publication.objects.values_list("environment_id", flat=True).get(
        pk=publication_id)
    with transaction.atomic():
        # Environment first, then publication: the lock order every writer uses.
        environment = locked_environment(environment_id)
        publication = Publication.objects.select_for_update().get(pk=publication_id)
        if publication.state != Publication.State.RENDERING:
            return publication
        latest = latest_ready_snapshot(environment)
        now = timezone.now()
        newest = (Snapshot.objects.filter(environment=environment).order_by("-number")
                  .only("pk", "number", "inputs_audit_id").first())
        if newest is not None and (newest.inputs_audit_id or 0) > (
            publication.inputs_audit_id or 0
        ):
            # Requested before the newest snapshot's request but finished after
            # it: storing it would silently bring older inputs back.
            publication.state = Publication.State.SUPERSEDED
            publication.snapshot = newest
            publication.finished_at = now
            publication.save(update_fields=["state", "snapshot", "finished_at"])
            emit("pending", environment_id=environment.pk)
            logger.info("publication %s superseded by %s #%s", publication.pk,
                        environment.full_name, newest.number)
            return publication
        if (
            rendered.is_valid
            and publication.kind == Publication.Kind.PUBLISH
            # A descriptor is a release: it is frozen into a snapshot of its own.
            and not publication.source.get("descriptor")
            and latest is not None
            and latest.checksum == rendered.checksum
            and latest.fallback_files == rendered.fallback_files
        ):
            publication.state = Publication.State.READY
            publication.snapshot = latest
            publication.deduplicated = True
            publication.finished_at = now
            publication.save(update_fields=["state", "snapshot", "deduplicated", "finished_at"])
            emit("pending", environment_id=environment.pk)
            logger.info(
                "publication %s matches %s #%s; no new snapshot",
                publication.pk, environment.full_name, latest.number,
            )
            return publication

        environment.snapshot_counter += 1
        environment.save(update_fields=["snapshot_counter"])
        state = Snapshot.State.READY if rendered.is_valid else Snapshot.State.INVALID
        number, label = environment.snapshot_counter, _label(environment, now.date())
        snapshot = Snapshot.objects.create(
            environment=environment,
            number=number,
            label=label,
            state=state,
            source=publication.source,
            effective_config=rendered.effective_config,
            provenance=rendered.provenance,
            files=rendered.files if rendered.is_valid else [],
            fallback_files=rendered.fallback_files if rendered.is_valid else [],
            checksum=rendered.checksum if rendered.is_valid else "",
            bundle=_bundle(number, label, rendered) if rendered.is_valid else b"",
            report=rendered.report(),
            inputs_audit_id=publication.inputs_audit_id,
            author=publication.author,
            parent=latest,
            rolled_back_from=publication.rolled_back_from,
        )
        publication.state = state
        publication.snapshot = snapshot
        publication.finished_at = now
        publication.save(update_fields=["state", "snapshot", "finished_at"])
        if not rendered.is_valid:
            action = "snapshot.invalid"
            summary = f"#{snapshot.number} is invalid: {len(rendered.problems)} problem(s)"
        elif publication.kind == Publication.Kind.ROLLBACK:
            action = "snapshot.rollback"
            summary = f"Rolled back to #{publication.rolled_back_from.number} as #{snapshot.number}"
        else:
            action, summary = "snapshot.create", f"Published #{snapshot.number}"
        audit_record(
            actor=publication.author,
            action=action,
            obj=snapshot,
            environment=environment,
            tenant=environment.application.tenant,
            summary=f"{summary} of {environment.full_name}",
            data={"number": snapshot.number, "checksum": snapshot.checksum},
        )
        emit("snapshot", environment_id=environment.pk, number=snapshot.number)
        emit("pending", environment_id=environment.pk)
        if rendered.is_valid and (
            publication.kind == Publication.Kind.ROLLBACK or not environment.require_activation
        ) and not environment_has_active_rollout(environment):
            # During a rollout the rollout decides what becomes active.
            environment_activate(environment=environment, snapshot=snapshot)
    logger.info(
        "%s #%s (%s) stored as %s", environment.full_name, snapshot.number, snapshot.label, state
    )
    return publication


def publication_reconcile(*, stale_after: timedelta = timedelta(minutes=5)) -> int:
    """Queue again the renders of publications still rendering after `stale_after`
    (a lost broker message or a killed worker). Safe: rendering is idempotent."""
    stale = Publication.objects.filter(
        state=Publication.State.RENDERING, created_at__lt=timezone.now() - stale_after
    ).values_list("pk", flat=True)
    from apps.snapshots.tasks import publication_render_task

    count = 0
    for publication_id in stale:
        logger.warning("publication %s still rendering; queueing it again", publication_id)
        publication_render_task.delay(str(publication_id))
        count += 1
    return count
