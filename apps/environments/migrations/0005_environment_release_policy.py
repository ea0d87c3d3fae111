"""The release policy replaces require_activation: an environment that required an
explicit activation is staged, every other one direct. And a version for
compare-and-set changes of the environment's own fields."""

from django.db import migrations, models


def policy_from_flag(apps, schema_editor):
    Environment = apps.get_model("environments", "Environment")
    Environment.objects.filter(require_activation=True).update(release_policy="staged")
    Environment.objects.filter(require_activation=False).update(release_policy="direct")


def flag_from_policy(apps, schema_editor):
    Environment = apps.get_model("environments", "Environment")
    Environment.objects.filter(release_policy="staged").update(require_activation=True)


class Migration(migrations.Migration):

    dependencies = [
        ('environments', '0004_environment_keep_rollout_pins'),
    ]

    operations = [
        migrations.AddField(
            model_name='environment',
            name='release_policy',
            field=models.CharField(choices=[('direct', 'Direct: publishing activates the new snapshot'), ('staged', 'Staged: a rollout or an explicit activation releases it')], default='direct', help_text='direct: publishing activates the new snapshot; staged: publishing stores it, and a rollout or an explicit activation releases it.', max_length=16),
        ),
        migrations.AddField(
            model_name='environment',
            name='version',
            field=models.PositiveIntegerField(default=1, editable=False),
        ),
        migrations.RunPython(policy_from_flag, flag_from_policy),
        migrations.RemoveField(
            model_name='environment',
            name='require_activation',
        ),
        migrations.AddConstraint(
            model_name='environment',
            constraint=models.CheckConstraint(condition=models.Q(('release_policy__in', ['direct', 'staged'])), name='environment_release_policy_valid'),
        ),
    ]
