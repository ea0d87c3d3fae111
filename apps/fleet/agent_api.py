"""The agent protocol (docs/design.md): enroll, drift. The poll, the bundle and
reports are answered in front of Django (agentapi)."""


from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.fields import LabelsField, NameField, ShownTextField, WholeNumberField
from apps.fleet import drift, enrollment, rules
from apps.fleet.authentication import AgentTokenAuthentication


class AgentAPIView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAuthenticated]

    @property
    def agent(self):
        return self.request.auth


class EnrollApi(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]

    class EnrollRequestSerializer(serializers.Serializer):
        enrollment_token = serializers.CharField(max_length=200)
        name = NameField(max_length=64)
        labels = LabelsField(required=False, default=dict)

    class EnrollResponseSerializer(serializers.Serializer):
        agent_id = WholeNumberField()
        token = serializers.CharField()
        environment = serializers.CharField()

    @extend_schema(request=EnrollRequestSerializer, responses={201: EnrollResponseSerializer},
                   summary="Exchange an enrollment token for the agent's own token")
    def post(self, request):
        data = self.EnrollRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        agent, token = enrollment.agent_enroll(**data.validated_data)
        return Response(
            {"agent_id": agent.pk, "token": token, "environment": agent.environment.full_name},
            status=status.HTTP_201_CREATED,
        )


class HealthSerializer(serializers.Serializer):
    """The agent's health probe after its reload (docs/agents.md), exactly typed: the
    agent sends JSON booleans, integers and strings, never "true" or "3"."""

    TYPES = {"ok": (bool, "a boolean"), "attempts": (int, "an integer"),
             "output": (str, "a string"), "probe": (str, "a string")}

    ok = serializers.BooleanField()
    attempts = WholeNumberField(min_value=1, max_value=1000)
    output = ShownTextField(max_length=2000, allow_blank=True, trim_whitespace=False)
    probe = serializers.ChoiceField(["command", "url"])

    def to_internal_value(self, data):
        if isinstance(data, dict):
            wrong = {name: [f"Must be {what}."] for name, (kind, what) in self.TYPES.items()
                     if name in data and (not isinstance(data[name], kind)
                                          or (kind is int and isinstance(data[name], bool)))}
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


class _StrictNameField(NameField):
    """A name that was sent as a string (a number is not a path)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class _StrictBooleanField(serializers.BooleanField):
    """A JSON boolean, never "yes", "true" or 1 (as the health probe's `ok`)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("Must be a boolean.")
        return data


class DriftFileSerializer(serializers.Serializer):
    """One drifted file: never its content, only a short summary of the change."""

    path = _StrictNameField(max_length=drift.MAX_DRIFT_PATH, trim_whitespace=False)
    change = serializers.ChoiceField(drift.DRIFT_CHANGES)
    summary = _StrictNameField(max_length=drift.MAX_SUMMARY, allow_blank=True, required=False,
                               default="", trim_whitespace=False)


class DriftApi(AgentAPIView):
    class DriftRequestSerializer(serializers.Serializer):
        snapshot = WholeNumberField(min_value=1, max_value=2**31 - 1)
        checksum = serializers.CharField(max_length=71)
        files = serializers.ListField(child=DriftFileSerializer(), allow_empty=True,
                                      max_length=drift.MAX_DRIFT_FILES)
        restored = _StrictBooleanField(required=False, default=False)

        def validate_files(self, value):
            repeated = rules.drift_repeated_path(f["path"] for f in value)
            if repeated is not None:  # named as files[i].path
                raise serializers.ValidationError(
                    [{}] * repeated + [{"path": ["Each path at most once."]}])
            return [dict(f) for f in value]

    class DriftResponseSerializer(serializers.Serializer):
        recorded = serializers.BooleanField(help_text="False for an identical repeat.")
        drifted = WholeNumberField(help_text="How many files are drifted now.")

    @extend_schema(request=DriftRequestSerializer, responses={200: DriftResponseSerializer},
                   summary="Report managed files that no longer match the applied snapshot "
                           "(an empty list: no longer drifted)")
    def post(self, request):
        data = self.DriftRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        recorded = drift.agent_drift_record(
            agent=self.agent, number=v["snapshot"], checksum=v["checksum"], files=v["files"],
            restored=v["restored"])
        return Response({"recorded": recorded, "drifted": len(v["files"])})
