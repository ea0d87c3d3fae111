"""Operator API for the fleet: agents and their status, modes, tokens, enrollment
tokens, activation and push deployments."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response

from apps.core.errors import NotFound, ValidationFailed
from apps.core.fields import AgentReferenceField, LabelsField, NameField, WholeNumberField
from apps.core.queries import FLAG_SPELLINGS, query_choice, query_flag
from apps.environments.models import Environment
from apps.environments.selectors import require_role
from apps.environments.views import (
    EnvironmentAPIView,
    QuarantineOverrideSerializer,
    quarantine_override,
)
from apps.fleet import enrollment, selectors, services
from apps.fleet.agent_api import HealthSerializer
from apps.fleet.models import DRIFTED, Agent, Deployment
from apps.fleet.rules import enroll_command
from apps.releases import services as releases
from apps.snapshots.selectors import snapshot_get
from apps.tenancy.models import Role


class AgentSerializer(serializers.ModelSerializer):
    environment = serializers.CharField(source="environment.full_name")
    status = serializers.SerializerMethodField()

    class Meta:
        model = Agent
        fields = ["id", "name", "environment", "labels", "enabled", "mode", "generation",
                  "created_at", "decommissioned_at", "status"]

    def get_status(self, agent) -> dict:
        seen = self.context["last_seen"].get(agent.pk)
        return selectors.agent_status(agent, seen)


def _agent_body(agent: Agent) -> dict:
    return AgentSerializer(agent, context={"last_seen": selectors.last_seen([agent])}).data


class DeploymentSerializer(serializers.ModelSerializer):
    agent = WholeNumberField(source="agent_id")
    snapshot = WholeNumberField(source="snapshot.number")
    health = HealthSerializer(read_only=True, allow_null=True)

    class Meta:
        model = Deployment
        fields = ["id", "agent", "snapshot", "kind", "state", "message", "health",
                  "created_at", "reported_at"]


DECOMMISSIONED_FILTER = OpenApiParameter(
    "decommissioned", str, enum=["false", "true", "any"], default="false",
    description="false (default): agents in service; true: only decommissioned ones; "
                "any: both.")


DRIFTED_FILTER = OpenApiParameter(
    "drifted", str, enum=list(FLAG_SPELLINGS), required=False,
    description="1 (true, yes): only agents with hand-edited managed files not restored "
                "(status.drift, restored false); 0 (false, no): only the others. Left out: "
                "all. Any other value, or the parameter twice, is 400.")


class AgentListApi(EnvironmentAPIView, ListAPIView):
    serializer_class = AgentSerializer

    @extend_schema(parameters=[DECOMMISSIONED_FILTER, DRIFTED_FILTER])
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def get_queryset(self):
        agents = Agent.objects.filter(environment=self.environment())
        shown = query_choice(self.request, "decommissioned", ("false", "true", "any"),
                             default="false")
        if shown == "false":
            agents = agents.in_service()
        elif shown == "true":
            agents = agents.decommissioned()
        drifted = query_flag(self.request, "drifted", default=None)
        if drifted is not None:
            agents = agents.filter(DRIFTED) if drifted else agents.exclude(DRIFTED)
        return selectors.agents_with_desired(agents).order_by("name", "pk")

    def get_serializer_context(self):
        context = super().get_serializer_context()
        page = getattr(self, "_page", None)
        context["last_seen"] = selectors.last_seen(page or [])
        return context

    def paginate_queryset(self, queryset):
        self._page = super().paginate_queryset(queryset)
        return self._page


class _AgentApi(EnvironmentAPIView):
    def agent_for(self, required: Role) -> Agent:
        agent = selectors.agents_with_desired(Agent.objects.filter(
            pk=self.kwargs["agent_id"],
            environment__in=Environment.objects.visible_to(self.request.user),
        )).first()
        if agent is None:
            raise NotFound("Agent not found.")
        require_role(user=self.request.user, environment=agent.environment, required=required)
        return agent


class AgentDetailApi(_AgentApi):
    class AgentUpdateSerializer(serializers.Serializer):
        mode = serializers.ChoiceField(Agent.Mode.choices, required=False)
        enabled = serializers.BooleanField(required=False)
        labels = LabelsField(required=False)

    @extend_schema(responses=AgentSerializer)
    def get(self, request, agent_id):
        return Response(_agent_body(self.agent_for(Role.VIEWER)))

    @extend_schema(request=AgentUpdateSerializer, responses=AgentSerializer,
                   summary="Switch mode (auto_pull | manual), enable or disable, set labels")
    def patch(self, request, agent_id):
        agent = self.agent_for(Role.DEPLOYER)
        data = self.AgentUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        if not data.validated_data:
            raise ValidationFailed("Nothing to change: send mode, enabled or labels.",
                                   code="empty_body")
        services.agent_update(agent=agent, actor=request.user, **data.validated_data)
        return Response(_agent_body(self.agent_for(Role.VIEWER)))


class AgentTokenRotateApi(_AgentApi):
    class AgentTokenSerializer(serializers.Serializer):
        token = serializers.CharField()

    @extend_schema(request=None, responses=AgentTokenSerializer,
                   summary="Replace the agent's token (shown only here)")
    def post(self, request, agent_id):
        token = enrollment.agent_token_rotate(agent=self.agent_for(Role.OWNER), actor=request.user)
        return Response({"token": token})


class AgentTokenRevokeApi(_AgentApi):
    @extend_schema(request=None, responses=AgentSerializer, summary="Revoke the agent's token")
    def post(self, request, agent_id):
        agent = enrollment.agent_token_revoke(agent=self.agent_for(Role.OWNER),
                                            actor=request.user)
        return Response(_agent_body(agent))


class AgentDecommissionApi(_AgentApi):
    class AgentDecommissionRequestSerializer(serializers.Serializer):
        expected_generation = WholeNumberField(min_value=1)

    @extend_schema(request=AgentDecommissionRequestSerializer, responses=AgentSerializer,
                   summary="Decommission the agent: token revoked, history kept, name free "
                           "(expected_generation: CAS)")
    def post(self, request, agent_id):
        agent = self.agent_for(Role.OWNER)
        data = self.AgentDecommissionRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        releases.agent_decommission(
            agent=agent, expected_generation=data.validated_data["expected_generation"],
            actor=request.user)
        return Response(_agent_body(self.agent_for(Role.VIEWER)))


class AgentDeploymentListApi(_AgentApi, ListAPIView):
    serializer_class = DeploymentSerializer

    def get_queryset(self):
        return Deployment.objects.filter(agent=self.agent_for(Role.VIEWER)).select_related(
            "snapshot").only("id", "agent_id", "snapshot__number", "kind", "state", "message",
                             "created_at", "reported_at").order_by("-created_at")


class EnrollmentTokenApi(EnvironmentAPIView):
    class EnrollmentTokenRequestSerializer(serializers.Serializer):
        uses = WholeNumberField(min_value=1, max_value=100_000, default=1)
        expires_in_s = WholeNumberField(min_value=60, max_value=365 * 86400,
                                                default=86400)
        name = NameField(max_length=100, required=False, default="", allow_blank=True)

    class EnrollmentTokenSerializer(serializers.Serializer):
        key = serializers.CharField()
        token = serializers.CharField()
        uses = WholeNumberField()
        expires_at = serializers.DateTimeField()
        command = serializers.CharField(help_text="The command that enrolls and runs an "
                                                  "agent on a host (fill in the "
                                                  "<placeholders>).")

    @extend_schema(request=EnrollmentTokenRequestSerializer,
                   responses={201: EnrollmentTokenSerializer},
                   summary="Create an enrollment token (the secret is shown only here)")
    def post(self, request, application, environment):
        env = self.environment(Role.OWNER)
        data = self.EnrollmentTokenRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        token, secret = enrollment.enrollment_token_create(
            environment=env, max_uses=v["uses"], name=v["name"], actor=request.user,
            expires_at=timezone.now() + timedelta(seconds=v["expires_in_s"]))
        command = enroll_command(server=request.build_absolute_uri("/"),
                                 enrollment_token=secret)
        return Response({"key": token.key, "token": secret, "uses": token.max_uses,
                         "expires_at": token.expires_at, "command": command},
                        status=status.HTTP_201_CREATED)


class SnapshotActivateApi(EnvironmentAPIView):
    class ActivateSerializer(QuarantineOverrideSerializer):
        """The release fields: a quarantine's override, `confirm`."""

    @extend_schema(request=ActivateSerializer, responses={200: None},
                   summary="Make a ready snapshot the one auto_pull agents follow")
    def post(self, request, application, environment, number):
        env = self.environment(Role.DEPLOYER)
        snapshot = snapshot_get(environment=env, number=number)
        data = self.ActivateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        releases.snapshot_activate(snapshot=snapshot, actor=request.user,
                                   override_reason=quarantine_override(
                                       request, env, data.validated_data),
                                   confirmed=data.validated_data["confirm"])
        return Response({"active": snapshot.number})


@extend_schema_field({"oneOf": [
    {"type": "array", "maxItems": 10_000,
     "items": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1}},
    {"type": "string", "enum": ["all"]}]})
class AgentSelectionField(serializers.Field):
    """Which agents a push goes to: a list of ids or names, or every enabled agent when the body
    says so (`[]` or `"all"`). It is required: a body that is missing, empty or was
    not read never means every agent."""

    default_error_messages = {"choice": 'Expected a list of agent ids or names, [] or "all".'}

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.ids = serializers.ListField(child=AgentReferenceField(), max_length=10_000)

    def to_internal_value(self, data):
        if data == "all":
            return []
        if not isinstance(data, list):
            self.fail("choice")
        return self.ids.run_validation(data)

    def to_representation(self, value):
        return value


class SnapshotDeployApi(EnvironmentAPIView):
    class DeployRequestSerializer(QuarantineOverrideSerializer):
        agents = AgentSelectionField()

    @extend_schema(request=DeployRequestSerializer,
                   responses={201: DeploymentSerializer(many=True)},
                   summary='Push a snapshot now to the listed agents ([] or "all": all enabled)')
    def post(self, request, application, environment, number):
        env = self.environment(Role.DEPLOYER)
        snapshot = snapshot_get(environment=env, number=number)
        data = self.DeployRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        agent_ids = selectors.agent_ids_named(env, agents=data.validated_data["agents"])["agents"]
        deployments = releases.snapshot_deploy(
            snapshot=snapshot, agent_ids=agent_ids, actor=request.user,
            override_reason=quarantine_override(request, env, data.validated_data),
            confirmed=data.validated_data["confirm"])
        for deployment in deployments:
            deployment.snapshot = snapshot
        return Response(DeploymentSerializer(deployments, many=True).data,
                        status=status.HTTP_201_CREATED)


class AgentPinRequestSerializer(QuarantineOverrideSerializer):
    snapshot = WholeNumberField(min_value=1, max_value=2**31 - 1)
    expected_generation = WholeNumberField(min_value=1)


class AgentPinReleaseRequestSerializer(serializers.Serializer):
    expected_generation = WholeNumberField(min_value=1)
    rollout = WholeNumberField(min_value=1, required=False, allow_null=True,
                                       help_text="The rollout whose pin this is, if any.")


class AgentPinApi(_AgentApi):
    @extend_schema(request=AgentPinRequestSerializer, responses=AgentSerializer,
                   summary="Hold the agent on a snapshot (expected_generation: CAS)")
    def post(self, request, agent_id):
        agent = self.agent_for(Role.DEPLOYER)
        data = AgentPinRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        snapshot = snapshot_get(environment=agent.environment,
                                number=data.validated_data["snapshot"])
        releases.agent_pin(agent=agent, snapshot=snapshot, actor=request.user,
                           expected_generation=data.validated_data["expected_generation"],
                           override_reason=quarantine_override(
                               request, agent.environment, data.validated_data),
                           confirmed=data.validated_data["confirm"])
        return Response(_agent_body(self.agent_for(Role.VIEWER)))


class AgentPinReleaseApi(_AgentApi):
    @extend_schema(request=AgentPinReleaseRequestSerializer, responses=AgentSerializer,
                   summary="Release the agent's pin (expected_generation: CAS)")
    def post(self, request, agent_id):
        agent = self.agent_for(Role.DEPLOYER)
        data = AgentPinReleaseRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        generation = data.validated_data["expected_generation"]
        releases.pin_release(agent=agent, rollout_id=data.validated_data.get("rollout"),
                             expected_generation=generation, actor=request.user)
        return Response(_agent_body(self.agent_for(Role.VIEWER)))
