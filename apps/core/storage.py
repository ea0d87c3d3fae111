"""How PostgreSQL stores the tables a rollout step rewrites whole.

A step changes a column of ten thousand rows at once (an agent's pin, a target's
state). PostgreSQL writes a new version of each row; when no indexed column
changes and the row's page has room, the new version stays on that page and no
index is touched (a heap-only tuple). Filling a table's pages only to
`fillfactor` percent keeps that room: at 40, every row of a page can be rewritten
in one statement even when the new version is longer (a pin set where there was
none, a timestamp where there was NULL), and the old versions are pruned before
the next step.
"""

from django.db import migrations


def fillfactor(table: str, percent: int) -> migrations.RunPython:
    """A migration operation leaving (100 - percent) % of each new page of `table`
    free on PostgreSQL. Pages already full keep their rows until an update moves
    them. SQLite (embedded mode) has no such setting: nothing to do there."""

    def alter(storage: str):
        def run(apps, schema_editor):
            if schema_editor.connection.vendor == "postgresql":
                schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} {storage}")
        return run

    return migrations.RunPython(alter(f"SET (fillfactor = {int(percent)})"),
                                alter("RESET (fillfactor)"), elidable=False)
