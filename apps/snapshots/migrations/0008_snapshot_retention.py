"""Retention: a snapshot is deleted only by the retention service, and its lineage
(parent, rolled_back_from) may be emptied when the snapshot it names is removed.

PostgreSQL: the immutability trigger allows parent_id and rolled_back_from_id to
become NULL (as author_id already could), and a DELETE trigger refuses any row
whose id the removing transaction did not name in `bellwether.snapshot_removal`
(set_config, transaction-local; apps.releases.retention sets it). SQLite (embedded
mode): the update trigger is recreated likewise; deletes are not refused there,
because Django's test flush deletes rows one table at a time (on PostgreSQL it
truncates, which fires no DELETE trigger).
"""

import importlib

import django.db.models.deletion
from django.db import migrations, models

_immutable = importlib.import_module("apps.snapshots.migrations.0002_snapshot_immutable")
_gzip = importlib.import_module("apps.snapshots.migrations.0007_snapshot_bundle_gzip")
LINEAGE = ["parent_id", "rolled_back_from_id"]
CONTENT_COLUMNS = [c for c in _gzip.CONTENT_COLUMNS if c not in LINEAGE]
SQLITE_CREATE = _immutable.SQLITE_CREATE.replace(
    " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in _immutable.CONTENT_COLUMNS),
    " OR ".join([*(f"NEW.{c} IS NOT OLD.{c}" for c in CONTENT_COLUMNS),
                 *(f"(NEW.{c} IS NOT OLD.{c} AND NEW.{c} IS NOT NULL)" for c in LINEAGE)]),
)
assert _gzip.SQLITE_CREATE != SQLITE_CREATE

POSTGRES_CREATE = """
CREATE OR REPLACE FUNCTION snapshots_snapshot_immutable() RETURNS trigger AS $$
BEGIN
    IF (to_jsonb(NEW) - 'author_id' - 'parent_id' - 'rolled_back_from_id')
           IS DISTINCT FROM (to_jsonb(OLD) - 'author_id' - 'parent_id' - 'rolled_back_from_id')
       OR (NEW.author_id IS DISTINCT FROM OLD.author_id AND NEW.author_id IS NOT NULL)
       OR (NEW.parent_id IS DISTINCT FROM OLD.parent_id AND NEW.parent_id IS NOT NULL)
       OR (NEW.rolled_back_from_id IS DISTINCT FROM OLD.rolled_back_from_id
           AND NEW.rolled_back_from_id IS NOT NULL) THEN
        RAISE EXCEPTION 'snapshot % of environment % is immutable', OLD.number, OLD.environment_id
            USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;
CREATE OR REPLACE FUNCTION snapshots_snapshot_removal() RETURNS trigger AS $$
BEGIN
    IF NOT (OLD.id::text = ANY(string_to_array(
            coalesce(current_setting('bellwether.snapshot_removal', true), ''), ','))) THEN
        RAISE EXCEPTION 'snapshot % of environment % is removed only by retention',
            OLD.number, OLD.environment_id USING ERRCODE = 'integrity_constraint_violation';
    END IF;
    RETURN OLD;
END;
$$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS snapshots_snapshot_removal ON snapshots_snapshot;
CREATE TRIGGER snapshots_snapshot_removal BEFORE DELETE ON snapshots_snapshot
    FOR EACH ROW EXECUTE FUNCTION snapshots_snapshot_removal();
"""
POSTGRES_DROP = """
DROP TRIGGER IF EXISTS snapshots_snapshot_removal ON snapshots_snapshot;
DROP FUNCTION IF EXISTS snapshots_snapshot_removal();
"""


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        _immutable._run(schema_editor, POSTGRES_CREATE)
    else:
        _immutable._run(schema_editor, _immutable.SQLITE_DROP)
        _immutable._run(schema_editor, SQLITE_CREATE)


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        _immutable._run(schema_editor, POSTGRES_DROP)
        _immutable._run(schema_editor, _immutable.POSTGRES_DROP)
        _immutable._run(schema_editor, _immutable.POSTGRES_CREATE)
    else:
        _immutable._run(schema_editor, _immutable.SQLITE_DROP)
        _immutable._run(schema_editor, _gzip.SQLITE_CREATE)


class Migration(migrations.Migration):

    dependencies = [
        ('snapshots', '0007_snapshot_bundle_gzip'),
    ]

    operations = [
        migrations.AddField(
            model_name='publication',
            name='confirmed',
            field=models.BooleanField(default=False),
        ),
        migrations.AddField(
            model_name='publication',
            name='needs_confirmation',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name='publication',
            name='rolled_back_from',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='snapshots.snapshot'),
        ),
        migrations.AlterField(
            model_name='snapshot',
            name='parent',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='snapshots.snapshot'),
        ),
        migrations.AlterField(
            model_name='snapshot',
            name='rolled_back_from',
            field=models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='snapshots.snapshot'),
        ),
        migrations.RunPython(create, drop),
    ]
