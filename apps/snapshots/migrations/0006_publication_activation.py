"""Publications say whether they activate their snapshot (from the release policy
when requested) and whether they did (unknown, null, for those finished before)."""

from django.db import migrations, models
from django.db.models import Q


def activates_from_policy(apps, schema_editor):
    Publication = apps.get_model("snapshots", "Publication")
    Publication.objects.filter(Q(kind="rollback") | Q(environment__release_policy="direct")
                               ).update(activates=True)


class Migration(migrations.Migration):

    dependencies = [
        ('snapshots', '0005_publication_claimed_at'),
        ('environments', '0005_environment_release_policy'),
    ]

    operations = [
        migrations.AddField(
            model_name='publication',
            name='activated',
            field=models.BooleanField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='publication',
            name='activates',
            field=models.BooleanField(default=False),
        ),
        migrations.RunPython(activates_from_policy, migrations.RunPython.noop),
    ]
