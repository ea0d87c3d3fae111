import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0003_quarantine_checksums'),
    ]

    operations = [
        migrations.AlterField(
            model_name='snapshotquarantine',
            name='environment',
            field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='+', to='environments.environment'),
        ),
        migrations.AddConstraint(
            model_name='snapshotquarantine',
            constraint=models.UniqueConstraint(fields=('environment', 'checksum'), name='quarantine_env_checksum_unique'),
        ),
    ]
