"""Publications and the snapshots they store.

A publication captures an environment's inputs under the environment's row lock;
it is rendered and validated outside any lock, then stored under the lock again:
superseded, matched to the identical latest snapshot, or stored as a new number.
What happens next (activation, queueing the render) is apps.releases' to decide.
"""

import json
import logging
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.compression import compressed
from apps.core.events import announce, emit
from apps.environments.models import Environment
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.rules import Outcome, publication_outcome
from apps.snapshots.selectors import latest_ready_snapshot
from configlang.isolated import render_isolated
from configlang.problems import Problem
from configlang.rendering import Rendered, render_source

logger = logging.getLogger(__name__)


def publication_create(*, environment: Environment, actor, kind: str, source: dict,
                       rolled_back_from: Snapshot | None = None,
                       activates: bool = False, confirmed: bool = False) -> Publication:
    """Record a publish or rollback request, to be rendered; `activates` says whether
    its snapshot is meant to become active when stored (apps.releases decides),
    `confirmed` that the requester accepts a degenerate render up front.
    Runs with the environment locked: the request's audit event id orders it."""
    locks.require_transaction()
    is_user = getattr(actor, "is_authenticated", False)
    publication = Publication(
        environment=environment, kind=kind, source=source, activates=activates,
        rolled_back_from=rolled_back_from, author=actor if is_user else None,
        confirmed=confirmed,
    )
    origin = source.get("promoted_from")
    what = (f"a rollback to #{rolled_back_from.number}" if rolled_back_from
            else f"a promotion of {origin['environment']} #{origin['number']}" if origin
            else f"descriptor {source['descriptor']['id']}" if source.get("descriptor")
            else "a publish")
    event = audit_record(
        actor=actor, action=Action.PUBLICATION_CREATE, obj=publication, environment=environment,
        tenant=environment.application.tenant,
        summary=f"Requested {what} of {environment.full_name}", data={"kind": kind},
    )
    publication.inputs_audit_id = event.pk
    publication.save()
    emit("pending", environment_id=environment.pk)
    logger.info("publication %s (%s) queued for %s", publication.pk, kind,
                environment.full_name)
    return publication


def publication_claim(*, publication_id: str, claim_lifetime: timedelta) -> bool:
    """Take a rendering publication for this worker, unless another worker's claim
    is still alive: one conditional UPDATE, committed before the render starts.
    False when it is finished or claimed, so a duplicate delivery costs no render."""
    now = timezone.now()
    claimed = Publication.objects.filter(pk=publication_id, state=Publication.State.RENDERING)
    return claimed.filter(Q(claimed_at__isnull=True)
                          | Q(claimed_at__lt=now - claim_lifetime)).update(claimed_at=now) == 1


def publication_rendered(publication: Publication) -> Rendered:
    """Render and validate a publication's source (no lock, nothing written): in a
    child process limited in memory and CPU (configlang.isolated) unless
    BELLWETHER_RENDER_ISOLATED is off."""
    seconds = settings.BELLWETHER_RENDER_SECONDS
    try:
        if settings.BELLWETHER_RENDER_ISOLATED:
            return render_isolated(publication.source, seconds=seconds,
                                   memory_bytes=settings.BELLWETHER_RENDER_MEMORY_MB << 20)
        return render_source(publication.source, seconds=seconds)
    except Exception as exc:
        # A bug must not leave the publication rendering forever.
        logger.exception("rendering publication %s failed", publication.pk)
        return failed_render(f"internal error while rendering ({type(exc).__name__})")


def failed_render(reason: str) -> Rendered:
    """The result of a render that could not complete (e.g. it timed out)."""
    return Rendered(effective_config={}, problems=[Problem("render_failed", reason)])


def _bundle(number: int, label: str, rendered: Rendered) -> bytes:
    """What an agent downloads, serialised once: bundles are immutable."""
    return json.dumps({
        "number": number,
        "label": label,
        "checksum": rendered.checksum,
        "files": rendered.files,
        "fallback_files": rendered.fallback_files,
        # The only placeholders an agent resolves (configlang.secrets).
        "secrets": rendered.secrets,
        # The mode of the files receiving them, when the environment declares one.
        **({"secret_file_mode": rendered.secret_file_mode}
           if rendered.secret_file_mode else {}),
    }, ensure_ascii=False, separators=(",", ":")).encode()


def _label(environment: Environment, today) -> str:
    """Today's date and the next of today's sequence: one past the highest label of
    the day still stored (a removed snapshot leaves a gap, never a repeat)."""
    prefix = f"{today:%Y%m%d}-"
    labels = Snapshot.objects.filter(environment=environment, label__startswith=prefix)
    highest = max((int(label.removeprefix(prefix)) for label in
                   labels.values_list("label", flat=True)
                   if label.removeprefix(prefix).isdigit()), default=0)
    return f"{prefix}{highest + 1:03d}"


def _outcome(environment: Environment, publication: Publication, rendered: Rendered,
             latest: Snapshot | None) -> Outcome:
    newest = (Snapshot.objects.filter(environment=environment).order_by("-number")
              .only("inputs_audit_id").first())
    return publication_outcome(
        inputs_audit_id=publication.inputs_audit_id,
        newest_inputs_audit_id=newest.inputs_audit_id if newest else None,
        is_valid=rendered.is_valid,
        is_plain_publish=(publication.kind == Publication.Kind.PUBLISH
                          and not publication.source.get("descriptor")),
        content=(rendered.checksum, rendered.fallback_files),
        latest_content=(latest.checksum, latest.fallback_files) if latest else None)


def _snapshot_create(environment: Environment, publication: Publication,
                     rendered: Rendered, parent: Snapshot | None) -> Snapshot:
    """The next number of `environment` (locked), holding `rendered`."""
    environment.snapshot_counter += 1
    environment.save(update_fields=["snapshot_counter"])
    number, label = environment.snapshot_counter, _label(environment, timezone.now().date())
    valid = rendered.is_valid
    bundle = _bundle(number, label, rendered) if valid else b""
    return Snapshot.objects.create(
        environment=environment, number=number, label=label,
        state=Snapshot.State.READY if valid else Snapshot.State.INVALID,
        source=publication.source, effective_config=rendered.effective_config,
        provenance=rendered.provenance,
        files=rendered.files if valid else [],
        fallback_files=rendered.fallback_files if valid else [],
        checksum=rendered.checksum if valid else "",
        bundle=bundle, bundle_gzip=compressed(bundle) if bundle else b"",
        report=rendered.report(), inputs_audit_id=publication.inputs_audit_id,
        author=publication.author, parent=parent,
        rolled_back_from=publication.rolled_back_from)


def _snapshot_audit(environment: Environment, publication: Publication,
                    snapshot: Snapshot, rendered: Rendered) -> None:
    if not rendered.is_valid:
        action = Action.SNAPSHOT_INVALID
        summary = f"#{snapshot.number} is invalid: {len(rendered.problems)} problem(s)"
    elif publication.kind == Publication.Kind.ROLLBACK:
        action = Action.SNAPSHOT_ROLLBACK
        summary = f"Rolled back to #{publication.rolled_back_from.number} as #{snapshot.number}"
    else:
        action, summary = Action.SNAPSHOT_CREATE, f"Published #{snapshot.number}"
    audit_record(actor=publication.author, action=action, obj=snapshot,
                 environment=environment, tenant=environment.application.tenant,
                 summary=f"{summary} of {environment.full_name}",
                 data={"number": snapshot.number, "checksum": snapshot.checksum})


def publication_store(*, environment: Environment, publication_id: str,
                      rendered: Rendered) -> tuple[Publication, Outcome | None]:
    """Store a rendered publication of `environment` (locked) as its outcome says.
    Returns (publication, outcome); outcome None when it was already finished."""
    publication = locks.lock_one(Publication.objects, pk=publication_id)
    if publication.state != Publication.State.RENDERING:
        return publication, None
    latest = latest_ready_snapshot(environment)
    outcome = _outcome(environment, publication, rendered, latest)
    publication.finished_at = timezone.now()
    publication.activated = False  # until publication_activated says otherwise
    if outcome == Outcome.SUPERSEDED:
        publication.state = Publication.State.SUPERSEDED
        publication.snapshot = Snapshot.objects.filter(environment=environment).latest("number")
        logger.info("publication %s superseded by %s #%s", publication.pk,
                    environment.full_name, publication.snapshot.number)
    elif outcome == Outcome.DUPLICATE:
        publication.state, publication.snapshot = Publication.State.READY, latest
        publication.deduplicated = True
        logger.info("publication %s matches %s #%s; no new snapshot", publication.pk,
                    environment.full_name, latest.number)
    else:
        snapshot = _snapshot_create(environment, publication, rendered, latest)
        publication.state, publication.snapshot = snapshot.state, snapshot
        _snapshot_audit(environment, publication, snapshot, rendered)
        emit("snapshot", environment_id=environment.pk, number=snapshot.number)
        announce("snapshot.published", environment_id=environment.pk, snapshot=snapshot.number,
                 label=snapshot.label, checksum=snapshot.checksum, kind=publication.kind,
                 state=snapshot.state)
        logger.info("%s #%s (%s) stored as %s", environment.full_name, snapshot.number,
                    snapshot.label, snapshot.state)
    publication.save(update_fields=["state", "snapshot", "deduplicated", "finished_at",
                                    "activated"])
    emit("pending", environment_id=environment.pk)
    return publication, outcome


def publication_hold(publication: Publication, findings: dict) -> None:
    """Hold a stored publication's snapshot back from activation until someone
    confirms its degenerate render (inside the transaction that stored it)."""
    locks.require_transaction()
    publication.needs_confirmation = findings
    publication.save(update_fields=["needs_confirmation"])


def publication_gate_held(publication: Publication, held: dict) -> None:
    """Record why a stored publication's snapshot, meant to become active, was not:
    the release gate's refusal {code, message, details} (inside the transaction
    that stored it)."""
    locks.require_transaction()
    publication.held = held
    publication.save(update_fields=["held"])


def publication_activated(publication: Publication) -> None:
    """Record that the stored publication's snapshot was activated (inside the
    transaction that activated it)."""
    locks.require_transaction()
    publication.activated = True
    publication.save(update_fields=["activated"])
