"""The SQLite immutability trigger names its columns; none may be forgotten."""

import importlib

from apps.snapshots.models import Snapshot


def test_the_trigger_guards_every_column_but_the_author():
    migration = importlib.import_module("apps.snapshots.migrations.0002_snapshot_immutable")
    columns = {field.column for field in Snapshot._meta.concrete_fields}

    assert set(migration.CONTENT_COLUMNS) == columns - {"id", "author_id"}
