"""Emptying the database after a test with transactions of its own (tests/flush.py):
every row a test wrote goes, content types and permissions stay."""

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command

from apps.audit.models import AuditEvent
from apps.snapshots.models import Snapshot
from apps.tenancy.models import Tenant
from tests import factories


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("reset_sequences", [False, True])  # as after a test; as by hand
def test_the_flush_empties_what_was_written_and_keeps_content_types_and_permissions(
        reset_sequences):
    superuser = factories.superuser()
    environment = factories.environment(
        factories.application(factories.tenant(actor=superuser), actor=superuser),
        templates=factories.SHOP_TEMPLATES, actor=superuser)
    factories.publish(environment, superuser)
    kept = ContentType.objects.count(), Permission.objects.count()
    assert kept[0] > 0 and kept[1] > 0

    call_command("flush", interactive=False, verbosity=0, reset_sequences=reset_sequences)

    assert not (Tenant.objects.exists() or Snapshot.objects.exists()
                or AuditEvent.objects.exists())
    assert (ContentType.objects.count(), Permission.objects.count()) == kept
