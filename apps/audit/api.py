"""Audit API: an environment's audit log."""

from rest_framework import serializers
from rest_framework.generics import ListAPIView

from apps.audit import selectors
from apps.audit.models import AuditEvent
from apps.environments.views import EnvironmentAPIView


class AuditEventSerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name")

    class Meta:
        model = AuditEvent
        fields = ["id", "actor", "action", "object_type", "object_id", "object_repr",
                  "summary", "data", "created_at"]


class AuditListApi(EnvironmentAPIView, ListAPIView):
    serializer_class = AuditEventSerializer

    def get_queryset(self):
        return selectors.audit_events_for(self.environment())
