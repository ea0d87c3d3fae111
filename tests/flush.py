"""How the test database is emptied after a test with transactions of its own
(pytest-django's transaction=True runs Django's `flush` after it).

Django's flush empties every table, content types and permissions included, and
then runs the post_migrate handlers to write those two back: on PostgreSQL a
TRUNCATE of some seventy tables and a few dozen queries, about half a second per
test. Here content types and permissions are left alone (no test changes them), so
nothing needs writing back, and only the tables a test wrote to are emptied: on
PostgreSQL with DELETE under `session_replication_role = replica` (no foreign-key
or guard triggers fire, as under TRUNCATE; it needs a superuser, as the suite's
database user is), else with Django's own statements (TRUNCATE ... CASCADE there).
"""

from __future__ import annotations

from contextlib import contextmanager

from django.core.management.commands import flush as flush_command

KEPT_TABLES = frozenset({"django_content_type", "auth_permission"})


def _written(connection, tables: list[str]) -> list[str]:
    """The tables among `tables` that hold a row (one query)."""
    if not tables:
        return []
    quote = connection.ops.quote_name
    probe = " UNION ALL ".join(f"SELECT {index} WHERE EXISTS (SELECT 1 FROM {quote(table)})"
                               for index, table in enumerate(tables))
    with connection.cursor() as cursor:
        cursor.execute(probe)
        return [tables[row[0]] for row in cursor.fetchall()]


def _superuser(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('is_superuser')")
        return cursor.fetchone()[0] == "on"


def sql_flush(style, connection, reset_sequences=True, allow_cascade=False):
    """Django's management.sql.sql_flush, for the tables tests write to only."""
    tables = [table for table in connection.introspection.django_table_names(
        only_existing=True, include_views=False) if table not in KEPT_TABLES]
    tables = _written(connection, tables)
    if connection.vendor == "postgresql" and not reset_sequences and _superuser(connection):
        quote = connection.ops.quote_name
        return ["SET LOCAL session_replication_role = replica",
                *(f"DELETE FROM {quote(table)}" for table in tables)]
    # Some tables are left out, so the ones referring to those emptied go too.
    return connection.ops.sql_flush(style, tables, reset_sequences=reset_sequences,
                                    allow_cascade=True)


@contextmanager
def written_tables_only():
    """Django's flush command, while open, empties only what tests wrote."""
    original = flush_command.sql_flush, flush_command.emit_post_migrate_signal
    flush_command.sql_flush = sql_flush
    flush_command.emit_post_migrate_signal = lambda *args, **kwargs: None
    try:
        yield
    finally:
        flush_command.sql_flush, flush_command.emit_post_migrate_signal = original
