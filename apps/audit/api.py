"""Audit API: an environment's audit log and its pending changes."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.response import Response

from apps.audit import selectors
from apps.audit.models import AuditEvent
from apps.core.views import EnvironmentAPIView


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


class PendingChangesApi(EnvironmentAPIView):
    class OutputSerializer(serializers.Serializer):
        class SnapshotRef(serializers.Serializer):
            number = serializers.IntegerField()
            label = serializers.CharField()

        class FileDiff(serializers.Serializer):
            path = serializers.CharField()
            status = serializers.CharField()
            diff = serializers.CharField()

        snapshot = SnapshotRef(allow_null=True)
        count = serializers.IntegerField()
        events = AuditEventSerializer(many=True)
        valid = serializers.BooleanField()
        errors = serializers.ListField(child=serializers.DictField())
        files = FileDiff(many=True)

    @extend_schema(responses=OutputSerializer,
                   summary="Changes since the latest ready snapshot, and their diff")
    def get(self, request, application, environment):
        pending = selectors.pending_changes(self.environment())
        snapshot = pending["snapshot"]
        return Response({
            "snapshot": {"number": snapshot.number, "label": snapshot.label} if snapshot else None,
            "count": len(pending["events"]),
            "events": AuditEventSerializer(pending["events"], many=True).data,
            "valid": pending["valid"],
            "errors": pending["errors"],
            "files": pending["files"],
        })
