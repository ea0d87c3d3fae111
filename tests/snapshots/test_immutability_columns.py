"""The SQLite immutability trigger names its columns; none may be forgotten."""

import importlib
import pkgutil

import apps.snapshots.migrations as migrations
from apps.snapshots.models import Snapshot


def _latest_trigger():
    names = sorted(m.name for m in pkgutil.iter_modules(migrations.__path__))
    modules = [importlib.import_module(f"{migrations.__name__}.{n}") for n in names]
    return [m for m in modules if hasattr(m, "CONTENT_COLUMNS")][-1]


def test_the_trigger_guards_every_column_but_the_author():
    """Content columns never change; lineage columns change only to NULL (when
    retention removes the snapshot they name)."""
    columns = {field.column for field in Snapshot._meta.concrete_fields}
    trigger = _latest_trigger()

    assert set(trigger.CONTENT_COLUMNS) | set(trigger.LINEAGE) == columns - {"id", "author_id"}
    for column in trigger.LINEAGE:
        assert f"(NEW.{column} IS NOT OLD.{column} AND NEW.{column} IS NOT NULL)" in (
            trigger.SQLITE_CREATE)
