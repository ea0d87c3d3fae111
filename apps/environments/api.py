"""Environment API: read, change config, put and remove templates and fallback files."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    extend_schema,
    extend_schema_field,
    extend_schema_view,
)
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import NotFound
from apps.core.fields import WholeNumberField
from apps.core.parsers import BoundedJSONParser, TextYAMLParser, YAMLParser
from apps.core.queries import FLAGS_SHOWN, query_flag
from apps.environments import services
from apps.environments.models import SETTING_RANGES, Environment
from apps.environments.selectors import environment_get, environment_role
from apps.environments.views import EnvironmentAPIView
from apps.releases import selectors as release_reads
from apps.releases import services as releases
from apps.snapshots.api import PublicationSerializer, publication_response
from apps.snapshots.selectors import descriptor_dry_run
from apps.tenancy.models import Role


class ActiveSnapshotSerializer(serializers.Serializer):
    number = WholeNumberField()
    label = serializers.CharField()
    checksum = serializers.CharField()


class ActiveRolloutSerializer(serializers.Serializer):
    id = WholeNumberField()
    state = serializers.CharField()
    current_wave = WholeNumberField()
    snapshot = WholeNumberField()
    url = serializers.CharField()


class EnvironmentListSerializer(serializers.ModelSerializer):
    """What is live: the active snapshot and rollout come annotated on the queryset
    (apps.releases.selectors.environments_live), so a page costs no query per row."""

    application = serializers.CharField(source="application.name")
    tenant = serializers.CharField(source="application.tenant.slug")
    active_snapshot = serializers.SerializerMethodField()
    active_rollout = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = Environment
        fields = ["application", "name", "full_name", "tenant", "release_policy", "version",
                  "active_snapshot", "active_rollout", "poll_interval_s", "drift_policy",
                  "keep_rollout_pins",
                  "snapshot_counter", "updated_at", "url"]

    @extend_schema_field(ActiveSnapshotSerializer(allow_null=True))
    def get_active_snapshot(self, obj) -> dict | None:
        """What auto_pull agents follow: {number, label, checksum}, or None."""
        s = obj.active_snapshot
        return {"number": s.number, "label": s.label, "checksum": s.checksum} if s else None

    @extend_schema_field(ActiveRolloutSerializer(allow_null=True))
    def get_active_rollout(self, obj) -> dict | None:
        """The running or paused rollout: {id, state, current_wave, snapshot, url}, or None."""
        if obj.active_rollout_id is None:
            return None
        return {"id": obj.active_rollout_id, "state": obj.active_rollout_state,
                "current_wave": obj.active_rollout_wave,
                "snapshot": obj.active_rollout_snapshot,
                "url": f"/api/v1/rollouts/{obj.active_rollout_id}"}

    def get_url(self, obj) -> str:
        return f"/api/v1/environments/{obj.application.name}/{obj.name}"


class EnvironmentFileSerializer(serializers.Serializer):
    path = serializers.CharField()
    content = serializers.CharField(allow_blank=True, trim_whitespace=False)


class EnvironmentDetailSerializer(EnvironmentListSerializer):
    templates = serializers.SerializerMethodField()
    fallback_files = EnvironmentFileSerializer(many=True, source="fallback_file_list")
    role = serializers.CharField()

    class Meta(EnvironmentListSerializer.Meta):
        fields = EnvironmentListSerializer.Meta.fields + [
            "config", "config_schema", "templates", "fallback_files", "role",
            *SETTING_RANGES,
        ]

    def get_templates(self, obj) -> list[dict]:
        return [{"path": t.path, "source": t.source} for t in obj.template_list]


def _detail(environment: Environment, user) -> dict:
    environment = release_reads.environments_live(
        Environment.objects.select_related("application__tenant")).get(pk=environment.pk)
    environment.template_list = list(environment.templates.order_by("path"))
    environment.fallback_file_list = [
        {"path": f.path, "content": f.content} for f in environment.fallback_files.order_by("path")
    ]
    environment.role = environment_role(user=user, environment=environment)
    return EnvironmentDetailSerializer(environment).data


class EnvironmentListApi(ListAPIView):
    serializer_class = EnvironmentListSerializer

    def get_queryset(self):
        return release_reads.environments_live(
            Environment.objects.visible_to(self.request.user).select_related(
                "application__tenant").order_by("application__name", "name"))


def _setting_field(name: str) -> WholeNumberField:
    """A bounded setting (retention, the shrink threshold): its range is the model's."""
    low, high = SETTING_RANGES[name]
    return WholeNumberField(required=False, min_value=low, max_value=high)


class EnvironmentDetailApi(EnvironmentAPIView):
    class EnvironmentUpdateSerializer(serializers.Serializer):
        config = serializers.CharField(required=False, allow_blank=True, trim_whitespace=False)
        config_schema = serializers.JSONField(required=False, allow_null=True)
        poll_interval_s = WholeNumberField(required=False, min_value=5, max_value=3600)
        keep_rollout_pins = serializers.BooleanField(required=False)
        drift_policy = serializers.ChoiceField(Environment.DriftPolicy.choices, required=False)
        release_policy = serializers.ChoiceField(Environment.ReleasePolicy.choices,
                                                 required=False)
        retention_snapshots = _setting_field("retention_snapshots")
        retention_bytes = _setting_field("retention_bytes")
        retention_rollouts = _setting_field("retention_rollouts")
        shrink_threshold_percent = _setting_field("shrink_threshold_percent")
        expected_version = WholeNumberField(
            required=False, min_value=1, max_value=2**31 - 1,
            help_text="The version you read: a change made since is refused (409 stale). "
                      "Required to change release_policy.")

        def validate(self, attrs):
            if "release_policy" in attrs and "expected_version" not in attrs:
                raise serializers.ValidationError({"expected_version": (
                    "Required to change release_policy: the version you read.")})
            return attrs

        def validate_config_schema(self, value):
            if value is not None and not isinstance(value, dict):
                raise serializers.ValidationError("Must be a JSON object or null.")
            return value

    @extend_schema(responses=EnvironmentDetailSerializer)
    def get(self, request, application, environment):
        return Response(_detail(self.environment(), request.user))

    @extend_schema(request=EnvironmentUpdateSerializer, responses=EnvironmentDetailSerializer)
    def patch(self, request, application, environment):
        env = self.environment(Role.OWNER)
        data = self.EnvironmentUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        env = releases.environment_update(environment=env, actor=request.user,
                                          **data.validated_data)
        return Response(_detail(env, request.user))


class _EnvironmentFileApi(EnvironmentAPIView):
    kind: str
    text_field: str

    def _entry(self, env):
        manager = env.templates if self.kind == "template" else env.fallback_files
        entry = manager.filter(path=self.kwargs["path"]).first()
        if entry is None:
            raise NotFound(f"No {self.kind} {self.kwargs['path']} in {env.full_name}.")
        return entry

    def _body(self, entry) -> dict:
        return {"path": entry.path, self.text_field: getattr(entry, self.text_field)}

    def get(self, request, application, environment, path):
        return Response(self._body(self._entry(self.environment())))

    def put(self, request, application, environment, path):
        env = self.environment(Role.OWNER)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        entry = services.environment_file_put(
            environment=env, kind=self.kind, path=path,
            text=data.validated_data[self.text_field], actor=request.user,
        )
        return Response(self._body(entry))

    def delete(self, request, application, environment, path):
        env = self.environment(Role.OWNER)
        self._entry(env)
        services.environment_file_delete(environment=env, kind=self.kind, path=path,
                                          actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class TemplateSerializer(serializers.Serializer):
    source = serializers.CharField(allow_blank=True, trim_whitespace=False)


class FallbackFileSerializer(serializers.Serializer):
    content = serializers.CharField(allow_blank=True, trim_whitespace=False)


@extend_schema_view(
    get=extend_schema(responses=TemplateSerializer),
    put=extend_schema(request=TemplateSerializer, responses=TemplateSerializer),
    delete=extend_schema(responses={204: None}),
)
class TemplateApi(_EnvironmentFileApi):
    """A file template (Jinja2, rendered with the environment's config)."""

    kind, text_field, InputSerializer = "template", "source", TemplateSerializer


@extend_schema_view(
    get=extend_schema(responses=FallbackFileSerializer),
    put=extend_schema(request=FallbackFileSerializer, responses=FallbackFileSerializer),
    delete=extend_schema(responses={204: None}),
)
class FallbackFileApi(_EnvironmentFileApi):
    """A literal file the agent writes when it has nothing to restore."""

    kind, text_field, InputSerializer = "fallback", "content", FallbackFileSerializer


class DescriptorSerializer(serializers.Serializer):
    """The descriptor itself, as YAML or JSON (apiVersion bellwether/v1)."""

    apiVersion = serializers.CharField()  # noqa: N815 - the descriptor's own key
    application = serializers.CharField()
    environment = serializers.CharField()
    id = serializers.CharField()
    version = serializers.CharField(required=False)
    params = serializers.DictField(required=False)
    secrets = serializers.DictField(child=serializers.CharField(), required=False)
    rollout = serializers.JSONField(required=False)
    rollback = serializers.JSONField(required=False)
    notes = serializers.CharField(required=False)


class DescriptorDryRunSerializer(serializers.Serializer):
    valid = serializers.BooleanField()
    errors = serializers.ListField(child=serializers.DictField())
    effective_config = serializers.JSONField()
    provenance = serializers.DictField(child=serializers.CharField())
    files = serializers.ListField(child=serializers.DictField())
    diff = serializers.ListField(child=serializers.DictField())
    against = WholeNumberField(allow_null=True)


class DescriptorSubmitApi(APIView):
    """POST a descriptor: merged with the environment's layers, rendered and published.
    `?dry_run=1` answers what it would publish and records nothing."""

    parser_classes = [BoundedJSONParser, YAMLParser, TextYAMLParser]
    query_parameters = ("dry_run",)  # any other is refused (apps.core.queries)

    @extend_schema(
        request=DescriptorSerializer,
        parameters=[OpenApiParameter("dry_run", OpenApiTypes.BOOL, description=(
            "Return the effective config, provenance, files and the diff against the "
            f"active snapshot; record nothing. Spelled {FLAGS_SHOWN}; any other value, "
            "or the parameter twice, is 400."))],
        responses={201: PublicationSerializer, 200: DescriptorDryRunSerializer,
                   202: PublicationSerializer},
        summary="Submit an app team's descriptor",
    )
    def post(self, request):
        descriptor = request.data
        services.descriptor_check(descriptor)
        environment = environment_get(user=request.user, application=descriptor["application"],
                                      name=descriptor["environment"], required=Role.DEPLOYER)
        if query_flag(request, "dry_run"):
            return Response(descriptor_dry_run(environment, descriptor))
        publication, created = releases.descriptor_submit(
            environment=environment, descriptor=descriptor, actor=request.user)
        return publication_response(publication, repeated=not created)
