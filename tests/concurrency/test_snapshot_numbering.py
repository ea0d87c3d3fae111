"""Snapshot numbering under concurrent renders, on PostgreSQL with real row locks.

Each test captures several publications first (nothing is enqueued: the rows are
created directly), then renders them all at once from threads released together
by a barrier, so the number allocation in `publication_finish` is what races.
"""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from apps.environments.models import Environment
from apps.environments.services import environment_file_delete, environment_file_put
from apps.releases.publishing import publication_complete
from apps.releases.services import environment_update
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.selectors import render_source_for
from tests.factories import CONFIG

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

# With the test's own connection this stays under the default pool size (10).
THREADS = 8
TIMEOUT_S = 60


def _config(workers: int) -> str:
    """The fixture's config with another worker count, so the rendered files differ."""
    assert "workers: 4\n" in CONFIG
    return CONFIG.replace("workers: 4\n", f"workers: {workers}\n")


def _capture(environment: Environment, author) -> Publication:
    """A publication of the environment's current inputs, created without a render task."""
    environment = Environment.objects.select_related("application").get(pk=environment.pk)
    return Publication.objects.create(
        environment=environment,
        kind=Publication.Kind.PUBLISH,
        source=render_source_for(environment),
        author=author,
    )


def _capture_distinct(environment: Environment, author, count: int, *, first_workers: int = 1):
    publications = []
    for workers in range(first_workers, first_workers + count):
        environment_update(environment=environment, config=_config(workers), actor=author)
        publications.append(_capture(environment, author))
    return publications


def _render_concurrently(publications: list[Publication]) -> dict[str, Publication]:
    """Render every publication in its own thread, all released at the same moment."""
    barrier = threading.Barrier(len(publications))

    def render(publication_id: str) -> Publication:
        try:
            barrier.wait(timeout=TIMEOUT_S)
            return publication_complete(publication_id=publication_id)
        finally:
            connection.close()

    ids = [str(p.pk) for p in publications]
    with ThreadPoolExecutor(max_workers=len(ids)) as pool:
        finished = list(pool.map(render, ids, timeout=TIMEOUT_S))
    return {str(p.pk): p for p in finished}


def _snapshots(environment: Environment) -> list[Snapshot]:
    return list(Snapshot.objects.filter(environment=environment).order_by("number"))


def test_concurrent_renders_of_distinct_content_get_numbers_one_to_n(environment, superuser):
    publications = _capture_distinct(environment, superuser, THREADS)

    finished = _render_concurrently(publications)

    snapshots = _snapshots(environment)
    assert [s.number for s in snapshots] == list(range(1, THREADS + 1))
    assert len({s.label for s in snapshots}) == THREADS
    assert {s.label[-3:] for s in snapshots} == {f"{n:03d}" for n in range(1, THREADS + 1)}
    assert all(s.state == Snapshot.State.READY for s in snapshots), [s.report for s in snapshots]
    assert len({s.checksum for s in snapshots}) == THREADS
    environment.refresh_from_db()
    assert environment.snapshot_counter == THREADS
    # Every publication got its own snapshot, and that snapshot holds its own content.
    assert all(p.state == Publication.State.READY and not p.deduplicated
               for p in finished.values())
    stored = Publication.objects.filter(pk__in=finished).select_related("snapshot")
    assert len({p.snapshot_id for p in stored}) == THREADS
    for publication in stored:
        assert publication.snapshot.source == publication.source


def test_invalid_concurrent_renders_consume_numbers_and_none_is_reused(environment, superuser):
    invalid_count = 3
    valid = _capture_distinct(environment, superuser, THREADS - invalid_count)
    # Parses, so it is accepted; fails at render time under StrictUndefined.
    environment_file_put(environment=environment, kind="template", path="broken.conf",
                         text="{{ no_such_setting }}\n", actor=superuser)
    invalid = _capture_distinct(environment, superuser, invalid_count, first_workers=100)
    environment_file_delete(environment=environment, kind="template", path="broken.conf",
                            actor=superuser)

    finished = _render_concurrently(valid + invalid)

    snapshots = _snapshots(environment)
    assert [s.number for s in snapshots] == list(range(1, THREADS + 1))
    assert len({s.label for s in snapshots}) == THREADS
    states = [s.state for s in snapshots]
    assert states.count(Snapshot.State.INVALID) == invalid_count
    assert states.count(Snapshot.State.READY) == THREADS - invalid_count
    for publication in invalid:
        done = finished[str(publication.pk)]
        assert done.state == Publication.State.INVALID
        assert done.snapshot.state == Snapshot.State.INVALID
        assert done.snapshot.files == []
        assert [e["file"] for e in done.snapshot.report["errors"]] == ["broken.conf"]
    for publication in valid:
        assert finished[str(publication.pk)].snapshot.state == Snapshot.State.READY
    environment.refresh_from_db()
    assert environment.snapshot_counter == THREADS

    # The next publication continues after the invalid numbers, never filling a gap.
    after = _capture_distinct(environment, superuser, 1, first_workers=1000)[0]
    assert publication_complete(publication_id=str(after.pk)).snapshot.number == THREADS + 1


def test_concurrent_renders_of_identical_content_reuse_the_existing_snapshot(
    environment, superuser
):
    existing = publication_complete(
        publication_id=str(_capture(environment, superuser).pk)
    ).snapshot
    assert existing.number == 1 and existing.state == Snapshot.State.READY
    publications = [_capture(environment, superuser) for _ in range(THREADS)]

    finished = _render_concurrently(publications)

    assert [s.pk for s in _snapshots(environment)] == [existing.pk]
    for publication in finished.values():
        assert publication.state == Publication.State.READY
        assert publication.deduplicated
        assert publication.snapshot_id == existing.pk
    environment.refresh_from_db()
    assert environment.snapshot_counter == 1


def test_concurrent_first_renders_of_identical_content_store_one_snapshot(
    environment, superuser
):
    publications = [_capture(environment, superuser) for _ in range(THREADS)]

    finished = _render_concurrently(publications)

    snapshots = _snapshots(environment)
    assert [s.number for s in snapshots] == [1]
    assert {p.snapshot_id for p in finished.values()} == {snapshots[0].pk}
    assert sorted(p.deduplicated for p in finished.values()) == [False] + [True] * (THREADS - 1)
    environment.refresh_from_db()
    assert environment.snapshot_counter == 1
