"""Environment owners who are no longer members of the environment's tenant own
nothing: drop those ownerships (membership removal now drops them too)."""

from django.db import migrations
from django.db.models import Exists, OuterRef


def drop_owners_outside_the_tenant(apps, schema_editor):
    Environment = apps.get_model("environments", "Environment")
    Membership = apps.get_model("tenancy", "Membership")
    Owner = Environment.owners.through
    member = Membership.objects.filter(user_id=OuterRef("user_id"),
                                       tenant_id=OuterRef("environment__application__tenant_id"))
    Owner.objects.exclude(Exists(member)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("environments", "0006_environment_drift_policy"),
        ("tenancy", "0001_initial"),
    ]

    operations = [
        migrations.RunPython(drop_owners_outside_the_tenant, migrations.RunPython.noop),
    ]
