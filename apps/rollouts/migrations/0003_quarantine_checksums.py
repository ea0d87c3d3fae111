"""Convert each per-snapshot quarantine to a quarantine of its snapshot's checksum
in its environment; of several quarantines of one content the first is kept."""

from django.db import migrations


def by_checksum(apps, schema_editor):
    SnapshotQuarantine = apps.get_model("rollouts", "SnapshotQuarantine")
    seen = set()
    for quarantine in SnapshotQuarantine.objects.select_related("snapshot").order_by("pk"):
        key = (quarantine.snapshot.environment_id, quarantine.snapshot.checksum)
        if key in seen:
            quarantine.delete()
            continue
        seen.add(key)
        SnapshotQuarantine.objects.filter(pk=quarantine.pk).update(
            environment_id=key[0], checksum=key[1])


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0002_quarantine_by_checksum'),
    ]

    operations = [
        migrations.RunPython(by_checksum, migrations.RunPython.noop),
    ]
