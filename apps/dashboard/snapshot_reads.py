"""What the dashboard shows of an environment's snapshots: the list (descriptor,
author, "identical to #N", active and quarantined marks) a page at a time, the
pair the compare page opens on, the change of the effective config between two
snapshots, and the pending changes with their diff against the active snapshot."""

import yaml
from django.core.paginator import Paginator
from django.db.models import OuterRef, Subquery
from django.db.models.fields.json import KT

from apps.core.errors import Unavailable
from apps.environments.models import Environment
from apps.releases import selectors as release_reads
from apps.snapshots.models import Snapshot, without_content
from configlang.diff import diff_files

SNAPSHOTS_PER_PAGE = 25
COMPARE_OFFERS = 200
EFFECTIVE_CONFIG = "effective config"  # the pseudo-file its diff is shown as


def snapshot_rows(environment: Environment):
    """The environment's snapshots, newest first, each with its descriptor's id and
    version and the oldest earlier snapshot with the same content (one query per
    page, whatever its length)."""
    same_content = (Snapshot.objects.filter(environment=environment, checksum=OuterRef(
        "checksum"), number__lt=OuterRef("number"), state=Snapshot.State.READY)
        .order_by("number").values("number")[:1])
    return (without_content(Snapshot.objects.filter(environment=environment)
                            .select_related("author", "rolled_back_from"), "", "rolled_back_from")
            .annotate(descriptor_id=KT("source__descriptor__id"),
                      descriptor_version=KT("source__descriptor__version"),
                      identical_to=Subquery(same_content))
            .order_by("-number"))


def mark(environment: Environment, snapshots: list[Snapshot]) -> list[Snapshot]:
    """Each snapshot with `quarantined` ({snapshot, rollout, reason, at} or None)."""
    flags = release_reads.snapshot_flags(environment)
    for snapshot in snapshots:
        snapshot.quarantined = release_reads.snapshot_state(snapshot, flags)["quarantined"]
    return snapshots


def snapshots_page(environment: Environment, page) -> dict:
    """One page of the snapshot list (`page` as sent: anything else than a page
    number is the first or the last page, never an error)."""
    paginator = Paginator(snapshot_rows(environment), SNAPSHOTS_PER_PAGE)
    current = paginator.get_page(page)
    return {"snapshots": mark(environment, list(current.object_list)), "page": current}


def ready_snapshots(environment: Environment) -> list[Snapshot]:
    """The ready snapshots the compare page offers, newest first."""
    return list(Snapshot.objects.filter(environment=environment, state=Snapshot.State.READY)
                .only("number", "label", "state").order_by("-number")[:COMPARE_OFFERS])


def default_pair(environment: Environment, ready: list[Snapshot]) -> tuple:
    """(from, to) the compare page opens on: the newest ready snapshot against the
    active one when it is newer (what a rollout would change), else the active one
    against the ready one before it (what the last release changed). `ready`:
    newest first. (None, None) when there is nothing to compare."""
    active = environment.active_snapshot
    newest = ready[0].number if ready else None
    if active is None:
        return (ready[1].number if len(ready) > 1 else None), newest
    if newest is not None and newest > active.number:
        return active.number, newest
    older = [s.number for s in ready if s.number < active.number]
    return (older[0] if older else None), active.number


def config_change(snapshot: Snapshot, against: int | None) -> list[dict]:
    """The diff of the effective config (as YAML) between `against` and `snapshot`,
    as one pseudo-file: a config-only change (a param no template reads) changes no
    file and still shows here. [] when the configs are equal."""
    def text(config) -> list[dict]:
        return [{"path": EFFECTIVE_CONFIG, "content": yaml.safe_dump(
            config, sort_keys=True, default_flow_style=False, allow_unicode=True)}]

    base = (Snapshot.objects.filter(environment_id=snapshot.environment_id, number=against)
            .values_list("effective_config", flat=True).first()) if against else None
    return diff_files(text(base) if against else [], text(snapshot.effective_config))


def pending_diff(environment: Environment) -> dict:
    """The pending changes rendered now against the active snapshot: {files, config,
    valid, errors, against, rolled_back}; {"unavailable": True} when no render slot
    is free (the panel says so and the events still show)."""
    try:
        pending = release_reads.pending_view(environment)
    except Unavailable:
        return {"unavailable": True, "rolled_back": None}
    return {key: pending[key] for key in ("files", "valid", "errors", "against",
                                          "rolled_back")}
