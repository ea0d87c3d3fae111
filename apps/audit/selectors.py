"""Reads of the audit log."""

from apps.audit.models import AuditEvent


def audit_events_for(environment):
    return AuditEvent.objects.filter(environment=environment).order_by("-id")
