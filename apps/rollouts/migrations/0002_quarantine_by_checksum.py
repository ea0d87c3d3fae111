"""Quarantine by content: a quarantine names its environment and checksum; the
snapshot it came from is kept (no longer one quarantine per snapshot)."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('environments', '0003_platformpolicy_descriptor'),
        ('rollouts', '0001_initial'),
    ]

    operations = [
        migrations.AlterField(
            model_name='snapshotquarantine',
            name='snapshot',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='quarantines', to='snapshots.snapshot'),
        ),
        migrations.AddField(
            model_name='snapshotquarantine',
            name='environment',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.CASCADE, related_name='+', to='environments.environment'),
        ),
        migrations.AddField(
            model_name='snapshotquarantine',
            name='checksum',
            field=models.CharField(default='', max_length=71),
            preserve_default=False,
        ),
    ]
