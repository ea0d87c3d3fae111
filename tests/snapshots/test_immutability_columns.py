"""The SQLite immutability trigger names its columns; none may be forgotten."""

import importlib
import pkgutil

import apps.snapshots.migrations as migrations
from apps.snapshots.models import Snapshot


def _latest_trigger_columns() -> list[str]:
    names = sorted(m.name for m in pkgutil.iter_modules(migrations.__path__))
    modules = [importlib.import_module(f"{migrations.__name__}.{n}") for n in names]
    return [m for m in modules if hasattr(m, "CONTENT_COLUMNS")][-1].CONTENT_COLUMNS


def test_the_trigger_guards_every_column_but_the_author():
    columns = {field.column for field in Snapshot._meta.concrete_fields}

    assert set(_latest_trigger_columns()) == columns - {"id", "author_id"}
