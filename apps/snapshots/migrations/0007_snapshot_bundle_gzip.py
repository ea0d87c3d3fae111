"""Bundles are also stored gzip-compressed, once, for agents that accept gzip.

The compressed bytes are content: immutable like the rest of the row. Existing
snapshots get theirs here, with the immutability trigger held off for that one
update (PostgreSQL: disabled in this transaction; SQLite: recreated with the new
column, as 0004 did).
"""

import gzip
import importlib

from django.db import migrations, models

_immutable = importlib.import_module("apps.snapshots.migrations.0002_snapshot_immutable")
_provenance = importlib.import_module("apps.snapshots.migrations.0004_snapshot_provenance")
CONTENT_COLUMNS = [*_provenance.CONTENT_COLUMNS, "bundle_gzip"]
SQLITE_CREATE = _immutable.SQLITE_CREATE.replace(
    " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in _immutable.CONTENT_COLUMNS),
    " OR ".join(f"NEW.{c} IS NOT OLD.{c}" for c in CONTENT_COLUMNS),
)
TRIGGER = "snapshots_snapshot_immutable"


def _compress_all(apps) -> None:
    Snapshot = apps.get_model("snapshots", "Snapshot")
    for snapshot in Snapshot.objects.exclude(bundle=b"").only("pk", "bundle").iterator(
            chunk_size=100):
        Snapshot.objects.filter(pk=snapshot.pk).update(
            bundle_gzip=gzip.compress(bytes(snapshot.bundle), compresslevel=6, mtime=0))


def compress_bundles(apps, schema_editor):
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        _immutable._run(schema_editor, f"ALTER TABLE snapshots_snapshot DISABLE TRIGGER {TRIGGER}")
        _compress_all(apps)
        _immutable._run(schema_editor, f"ALTER TABLE snapshots_snapshot ENABLE TRIGGER {TRIGGER}")
    else:  # sqlite: the AddField may have rebuilt the table (and dropped the trigger)
        _immutable._run(schema_editor, _immutable.SQLITE_DROP)
        _compress_all(apps)
        _immutable._run(schema_editor, SQLITE_CREATE)


def restore_sqlite_trigger(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        _immutable._run(schema_editor, _immutable.SQLITE_DROP)
        _immutable._run(schema_editor, _provenance.SQLITE_CREATE)


class Migration(migrations.Migration):

    dependencies = [
        ('snapshots', '0006_publication_activation'),
    ]

    operations = [
        migrations.AddField(
            model_name='snapshot',
            name='bundle_gzip',
            field=models.BinaryField(default=b'', editable=False),
        ),
        migrations.RunPython(compress_bundles, restore_sqlite_trigger),
    ]
