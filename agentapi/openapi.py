"""The agents' routes that agentapi answers in front of Django, declared for the
OpenAPI schema only (project/schema_urls.py): Django never routes a request here."""

from django.urls import path
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers

from agentapi.reports import ReportAnswerSerializer, ReportSerializer
from apps.core.fields import WholeNumberField
from apps.environments.models import Environment
from apps.fleet.agent_api import AgentAPIView
from apps.fleet.models import Agent


class DesiredSerializer(serializers.Serializer):
    class DesiredSnapshotSerializer(serializers.Serializer):
        number = WholeNumberField()
        label = serializers.CharField()
        checksum = serializers.CharField()
        bundle_url = serializers.CharField()

    snapshot = DesiredSnapshotSerializer(allow_null=True)
    deployment_id = serializers.UUIDField(allow_null=True)
    mode = serializers.ChoiceField(Agent.Mode.choices)
    poll_interval_s = WholeNumberField()
    drift_policy = serializers.ChoiceField(Environment.DriftPolicy.choices)


class DesiredApi(AgentAPIView):
    @extend_schema(
        parameters=[OpenApiParameter(
            "wait", int, description="Long-poll: with If-None-Match, hold the answer until "
            "the desired state changes or this many seconds pass (at most the "
            "Bellwether-Long-Poll header's value; more is served as that), then 304")],
        responses={200: DesiredSerializer, 304: OpenApiResponse(
            description="Not modified (If-None-Match matched)")},
        summary="The agent's desired snapshot (send If-None-Match)")
    def get(self, request):
        raise NotImplementedError("answered by agentapi.cached, in front of Django")


class BundleApi(AgentAPIView):
    @extend_schema(responses={200: OpenApiResponse(description=(
        "{number, label, checksum, files: [{path, content}], fallback_files: [...], "
        "secrets: [{placeholder, reference, files}], secret_file_mode?} (the secrets "
        "manifest: the only placeholders an agent resolves; the mode of the files "
        "receiving them when the environment declares one); ETag is the checksum in "
        "quotes, with +gzip for the gzip representation"))},
        summary="A snapshot's files (immutable); gzip-compressed (stored so) when "
                "Accept-Encoding allows it")
    def get(self, request, number):
        raise NotImplementedError("answered by agentapi.bundle, in front of Django")


class ReportApi(AgentAPIView):
    @extend_schema(request=ReportSerializer, responses={201: ReportAnswerSerializer,
                                                        200: ReportAnswerSerializer},
                   summary="Report the result of applying a snapshot")
    def post(self, request):
        raise NotImplementedError("answered by agentapi.reports, in front of Django")


urlpatterns = [
    path("agent/desired", DesiredApi.as_view(), name="agent-desired"),
    path("agent/snapshots/<int:number>/bundle", BundleApi.as_view(), name="agent-bundle"),
    path("agent/reports", ReportApi.as_view(), name="agent-reports"),
]
