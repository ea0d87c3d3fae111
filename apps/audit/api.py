"""Audit API: an environment's audit log and its pending changes."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.generics import ListAPIView
from rest_framework.response import Response

from apps.audit import selectors
from apps.audit.models import AuditEvent
from apps.core.views import EnvironmentAPIView
from apps.snapshots.api import FileDiffSerializer, ProblemSerializer


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


class PendingChangesSerializer(serializers.Serializer):
    class PendingSnapshotSerializer(serializers.Serializer):
        number = serializers.IntegerField()
        label = serializers.CharField()

    snapshot = PendingSnapshotSerializer(allow_null=True)
    count = serializers.IntegerField()
    events = AuditEventSerializer(many=True)
    valid = serializers.BooleanField()
    errors = ProblemSerializer(many=True)
    files = FileDiffSerializer(many=True)


class PendingChangesApi(EnvironmentAPIView):
    @extend_schema(responses=PendingChangesSerializer,
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
