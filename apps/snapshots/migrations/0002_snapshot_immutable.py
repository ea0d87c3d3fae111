"""A stored snapshot is immutable: the database refuses updates of its content.

Only author_id may change, and only to NULL (when its user is deleted).
"""

from django.db import migrations

CONTENT_COLUMNS = [
    "environment_id", "number", "label", "state", "source", "effective_config", "files",
    "fallback_files", "checksum", "bundle", "report", "inputs_audit_id", "parent_id",
    "rolled_back_from_id", "created_at",
]

POSTGRES_CREATE = """
CREATE OR REPLACE FUNCTION snapshots_snapshot_immutable() RETURNS trigger AS $$
BEGIN
    IF (to_jsonb(NEW) - 'author_id') IS DISTINCT FROM (to_jsonb(OLD) - 'author_id')
       OR (NEW.author_id IS DISTINCT FROM OLD.author_id AND NEW.author_id IS NOT NULL) THEN
        RAISE EXCEPTION 'snapshot % of environment % is immutable', OLD.number, OLD.environment_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER snapshots_snapshot_immutable BEFORE UPDATE ON snapshots_snapshot
    FOR EACH ROW EXECUTE FUNCTION snapshots_snapshot_immutable();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS snapshots_snapshot_immutable ON snapshots_snapshot;
DROP FUNCTION IF EXISTS snapshots_snapshot_immutable();
"""

SQLITE_CREATE = f"""
CREATE TRIGGER snapshots_snapshot_immutable BEFORE UPDATE ON snapshots_snapshot
WHEN {" OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in CONTENT_COLUMNS)}
    OR (NEW.author_id IS NOT OLD.author_id AND NEW.author_id IS NOT NULL)
BEGIN
    SELECT RAISE(ABORT, 'snapshot is immutable');
END;
"""
SQLITE_DROP = "DROP TRIGGER IF EXISTS snapshots_snapshot_immutable;"


def create(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    sql = {"postgresql": POSTGRES_CREATE, "sqlite": SQLITE_CREATE}.get(vendor)
    if sql is None:
        raise RuntimeError(f"no immutability trigger for database vendor {vendor!r}")
    _run(schema_editor, sql)


def _run(schema_editor, sql: str) -> None:
    # Without parameters, so the driver leaves PL/pgSQL's % placeholders alone.
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(sql)


def drop(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    _run(schema_editor, {"postgresql": POSTGRES_DROP, "sqlite": SQLITE_DROP}[vendor])


class Migration(migrations.Migration):
    dependencies = [("snapshots", "0001_initial")]

    operations = [migrations.RunPython(create, drop)]
