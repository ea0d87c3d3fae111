"""Snapshot API: preview, publish, publication status, list, detail, diff, rollback."""

from django.db.models import F
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.audit.api import AuditEventSerializer
from apps.core.api import error_response
from apps.core.errors import NotFound
from apps.core.fields import WholeNumberField
from apps.core.queries import query_number
from apps.environments.models import Environment
from apps.environments.views import EnvironmentAPIView
from apps.releases import selectors as release_reads
from apps.releases import services as releases
from apps.snapshots import selectors
from apps.snapshots.guard_api import ConfirmSerializer, RollbackSerializer, confirmation_response
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.rules import publication_progress
from apps.snapshots.serializers import (
    FileDiffSerializer,
    FileSerializer,
    HeldSerializer,
    PreviewSerializer,
    ProblemSerializer,
    SnapshotDiffSerializer,
)
from apps.tenancy.models import Role


def snapshot_url(environment: Environment, number: int) -> str:
    return f"/api/v1/environments/{environment.full_name}/snapshots/{number}"


class QuarantineSerializer(serializers.Serializer):
    snapshot = WholeNumberField(help_text="The snapshot rolled back with this content.")
    rollout = WholeNumberField(allow_null=True)
    reason = serializers.CharField()
    at = serializers.DateTimeField()


class SnapshotSummarySerializer(serializers.ModelSerializer):
    """Needs the context's `flags` (apps.releases.selectors.snapshot_flags)."""

    author = serializers.CharField(source="author_name", allow_null=True)
    parent = WholeNumberField(source="parent_number", allow_null=True)
    rolled_back_from = WholeNumberField(
        source="rolled_back_from_number", allow_null=True
    )
    active = serializers.SerializerMethodField()
    quarantined = serializers.SerializerMethodField()

    class Meta:
        model = Snapshot
        fields = ["number", "label", "state", "checksum", "author", "parent",
                  "rolled_back_from", "active", "quarantined", "created_at"]

    def get_active(self, obj) -> bool:
        return release_reads.snapshot_state(obj, self.context["flags"])["active"]

    @extend_schema_field(QuarantineSerializer(allow_null=True))
    def get_quarantined(self, obj) -> dict | None:
        return release_reads.snapshot_state(obj, self.context["flags"])["quarantined"]


class SnapshotDetailSerializer(SnapshotSummarySerializer):
    files = FileSerializer(many=True)
    fallback_files = FileSerializer(many=True)
    report = serializers.JSONField()
    effective_config = serializers.JSONField()
    provenance = serializers.DictField(child=serializers.CharField())
    source = serializers.JSONField()

    class Meta(SnapshotSummarySerializer.Meta):
        fields = SnapshotSummarySerializer.Meta.fields + [
            "effective_config", "provenance", "files", "fallback_files", "report", "source"
        ]


def _annotated(queryset):
    return queryset.annotate(author_name=F("author__username"), parent_number=F("parent__number"),
                             rolled_back_from_number=F("rolled_back_from__number"))


class ReleaseSerializer(serializers.Serializer):
    policy = serializers.ChoiceField(Environment.ReleasePolicy.choices,
                                     help_text="The environment's release policy now.")
    released_by = serializers.ListField(
        child=serializers.ChoiceField(["rollout", "activation"]),
        help_text="What releases the stored, not active snapshot: a rollout "
                  "(POST …/rollouts) or an explicit activation (POST …/snapshots/<n>/"
                  "activate). Empty when it is active or there is nothing to release.")
    note = serializers.CharField(allow_blank=True)


class PublicationSerializer(serializers.ModelSerializer):
    environment = serializers.CharField(source="environment.full_name")
    snapshot = serializers.SerializerMethodField()
    errors = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    release = serializers.SerializerMethodField()
    held = serializers.SerializerMethodField()
    url = serializers.SerializerMethodField()

    class Meta:
        model = Publication
        fields = ["id", "kind", "state", "environment", "deduplicated", "activates",
                  "activated", "release", "snapshot", "errors", "progress", "created_at",
                  "claimed_at", "finished_at", "url", "needs_confirmation", "confirmed",
                  "held"]
        extra_kwargs = {
            "activates": {"help_text": "Whether its snapshot becomes active when stored, "
                                       "from the release policy when it was requested "
                                       "(known at once, also while rendering)."},
            "activated": {"help_text": "Whether it did: null while rendering."},
            "needs_confirmation": {"help_text": "A degenerate render held back: {against, "
                                                "emptied: [paths], shrink} (POST …/confirm)."},
        }

    def _state(self, obj) -> dict:
        if not hasattr(obj, "_snapshot_state"):
            obj._snapshot_state = None if obj.snapshot is None else release_reads.snapshot_state(
                obj.snapshot, release_reads.snapshot_flags(obj.environment))
        return obj._snapshot_state

    def get_progress(self, obj) -> str | None:
        return publication_progress(is_rendering=obj.state == Publication.State.RENDERING,
                                    created_at=obj.created_at, claimed_at=obj.claimed_at)

    def get_snapshot(self, obj) -> dict | None:
        s = obj.snapshot
        if s is None:
            return None
        return {"number": s.number, "label": s.label, "state": s.state,
                "checksum": s.checksum, "url": snapshot_url(obj.environment, s.number),
                **self._state(obj)}

    @extend_schema_field(ReleaseSerializer)
    def get_release(self, obj) -> dict:
        state = self._state(obj)
        return release_reads.publication_release(
            obj, snapshot_active=bool(state and state["active"]))

    @extend_schema_field(HeldSerializer(allow_null=True, help_text=(
        "Why its snapshot, meant to become active, was stored and not activated: the "
        "release gate's refusal when it was stored (null once that snapshot is active). "
        "In a governed environment a publish with the direct policy holds "
        "approval_required, naming the release submitted to activate it.")))
    def get_held(self, obj) -> dict | None:
        state = self._state(obj)
        return None if state is None or state["active"] else obj.held

    def get_errors(self, obj) -> list[dict]:
        if obj.state != Publication.State.INVALID:
            return []
        return obj.snapshot.report.get("errors", [])

    def get_url(self, obj) -> str:
        return f"/api/v1/publications/{obj.pk}"


def publication_response(publication: Publication, *, repeated: bool = False) -> Response:
    """202 while rendering; 201 for a new snapshot, 200 for an identical existing one;
    400 naming every problem when the render was invalid; 409 when a later request
    finished first, or confirmation_required when its render is held as degenerate."""
    publication = Publication.objects.select_related("environment__application", "snapshot").get(
        pk=publication.pk
    )
    body = PublicationSerializer(publication).data
    if publication.state == Publication.State.RENDERING:
        return Response(body, status=status.HTTP_202_ACCEPTED,
                        headers={"Location": body["url"]})
    if publication.state == Publication.State.SUPERSEDED:
        response = error_response(
            409, "superseded",
            f"A later request finished first as #{publication.snapshot.number}; this "
            "one's inputs are older and were not stored.",
        )
        response.data["error"]["publication"] = body
        return response
    if publication.needs_confirmation and not publication.confirmed:
        return confirmation_response(publication, body)
    if publication.state == Publication.State.INVALID:
        errors = body["errors"]
        first = errors[0] if errors else {"message": "invalid"}
        where = ":".join(str(first[k]) for k in ("file", "line") if k in first)
        response = error_response(
            400,
            "snapshot_invalid",
            f"Snapshot {publication.snapshot.number} is invalid ({len(errors)} problem(s)); "
            f"first: {where + ': ' if where else ''}{first['message']}",
            errors,
        )
        response.data["error"]["publication"] = body
        return response
    code = (status.HTTP_200_OK if publication.deduplicated or repeated
            else status.HTTP_201_CREATED)
    return Response(body, status=code, headers={"Location": body["snapshot"]["url"]})


class PreviewApi(EnvironmentAPIView):
    @extend_schema(responses=PreviewSerializer,
                   summary="Render the current config; records nothing")
    def get(self, request, application, environment):
        rendered = selectors.snapshot_preview(self.environment())
        selectors.refuse_render_limit(rendered.problems)
        return Response({
            "valid": rendered.is_valid,
            "errors": [p.as_dict() for p in rendered.problems],
            "checksum": rendered.checksum if rendered.is_valid else None,
            "effective_config": rendered.effective_config,
            "provenance": rendered.provenance,
            "files": rendered.files,
            "fallback_files": rendered.fallback_files,
        })


class PublishApi(EnvironmentAPIView):
    @extend_schema(request=ConfirmSerializer, responses={200: PublicationSerializer,
                                                         201: PublicationSerializer,
                                                         202: PublicationSerializer},
                   summary="Render, validate and store a snapshot of the current config")
    def post(self, request, application, environment):
        env, data = self.environment(Role.DEPLOYER), ConfirmSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return publication_response(releases.snapshot_publish(
            environment=env, actor=request.user, confirmed=data.validated_data["confirm"]))


class PublicationDetailApi(APIView):
    @extend_schema(responses=PublicationSerializer)
    def get(self, request, publication_id):
        publication = (Publication.objects.filter(
            pk=publication_id, environment__in=Environment.objects.visible_to(request.user))
            .select_related("environment__application", "snapshot").first())
        if publication is None:
            raise NotFound("Publication not found.")
        return Response(PublicationSerializer(publication).data)


class SnapshotListApi(EnvironmentAPIView, ListAPIView):
    serializer_class = SnapshotSummarySerializer

    def get_serializer_context(self):
        env = getattr(self, "_env", None) or self.environment()
        return {**super().get_serializer_context(),
                "flags": release_reads.snapshot_flags(env)}

    def get_queryset(self):
        self._env = self.environment()
        return _annotated(
            Snapshot.objects.filter(environment=self._env)
            .defer("source", "files", "fallback_files", "effective_config", "report")
            .order_by("-number")
        )


class SnapshotDetailApi(EnvironmentAPIView):
    @extend_schema(responses=SnapshotDetailSerializer)
    def get(self, request, application, environment, number):
        env = self.environment()
        snapshot = _annotated(Snapshot.objects.filter(environment=env, number=number)).first()
        if snapshot is None:
            raise NotFound(f"Snapshot {number} of {env.full_name} not found.")
        return Response(SnapshotDetailSerializer(
            snapshot, context={"flags": release_reads.snapshot_flags(env)}).data)


NUMBER_MAX = 2**31 - 1  # snapshot numbers


class SnapshotDiffApi(EnvironmentAPIView):
    class QuerySerializer(serializers.Serializer):  # the schema's; read by query_number
        against = WholeNumberField(
            required=False, min_value=1, max_value=NUMBER_MAX,
            help_text="The snapshot number to compare with; defaults to the previous one.")

    @extend_schema(
        parameters=[QuerySerializer],  # the schema states the constraints the server checks
        responses=SnapshotDiffSerializer,
    )
    def get(self, request, application, environment, number):
        against = query_number(request, "against", minimum=1, maximum=NUMBER_MAX)
        snapshot = selectors.snapshot_get(environment=self.environment(), number=number)
        return Response(selectors.snapshot_diff(snapshot=snapshot, against=against))


class SnapshotRollbackApi(EnvironmentAPIView):
    @extend_schema(request=RollbackSerializer, responses={201: PublicationSerializer,
                                                          202: PublicationSerializer},
                   summary="Create a new snapshot re-rendered from snapshot n's stored source")
    def post(self, request, application, environment, number):
        snapshot = selectors.snapshot_get(environment=self.environment(Role.DEPLOYER),
                                          number=number)
        data = RollbackSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return publication_response(releases.snapshot_rollback(
            snapshot=snapshot, actor=request.user, confirmed=data.validated_data["confirm"]))


class ReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")


class SnapshotQuarantineLiftApi(EnvironmentAPIView):
    @extend_schema(request=ReasonSerializer, responses=SnapshotSummarySerializer,
                   summary="Lift the quarantine of snapshot n's content (owners)")
    def post(self, request, application, environment, number):
        env = self.environment(Role.OWNER)
        data = ReasonSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        releases.snapshot_quarantine_lift(snapshot=selectors.snapshot_get(
            environment=env, number=number), actor=request.user, **data.validated_data)
        snapshot = _annotated(Snapshot.objects.filter(environment=env, number=number)).get()
        return Response(SnapshotSummarySerializer(
            snapshot, context={"flags": release_reads.snapshot_flags(env)}).data)


class PendingChangesSerializer(serializers.Serializer):
    class PendingSnapshotSerializer(serializers.Serializer):
        number = WholeNumberField()
        label = serializers.CharField()

    class RolledBackSerializer(serializers.Serializer):
        rollout = WholeNumberField(allow_null=True)
        snapshot = WholeNumberField()

    snapshot = PendingSnapshotSerializer(allow_null=True)
    against = PendingSnapshotSerializer(allow_null=True,
                                        help_text="What the diff is against: the active "
                                                  "snapshot (else the latest ready one).")
    count = WholeNumberField()
    events = AuditEventSerializer(many=True)
    valid = serializers.BooleanField()
    errors = ProblemSerializer(many=True)
    checksum = serializers.CharField(allow_null=True)
    rolled_back = RolledBackSerializer(allow_null=True)
    message = serializers.CharField(allow_blank=True)
    files = FileDiffSerializer(many=True)


def pending_body(environment: Environment) -> dict:
    pending = release_reads.pending_view(environment)
    selectors.refuse_render_limit(pending["errors"])

    def brief(snapshot):
        return {"number": snapshot.number, "label": snapshot.label} if snapshot else None

    return {
        "snapshot": brief(pending["snapshot"]),
        "against": brief(pending["against"]),
        "count": len(pending["events"]),
        "events": AuditEventSerializer(pending["events"], many=True).data,
        **{k: pending[k] for k in ("valid", "errors", "checksum", "rolled_back", "message",
                                   "files")},
    }


class PendingChangesApi(EnvironmentAPIView):
    @extend_schema(responses=PendingChangesSerializer,
                   summary="Changes since the latest ready snapshot; diff against the active one")
    def get(self, request, application, environment):
        return Response(pending_body(self.environment()))


class InputsResetApi(EnvironmentAPIView):
    @extend_schema(request=None, responses=PendingChangesSerializer,
                   summary="Reset the inputs to the active snapshot's stored source (owners)")
    def post(self, request, application, environment):
        env = releases.environment_inputs_reset(environment=self.environment(Role.OWNER),
                                                actor=request.user)
        return Response(pending_body(Environment.objects.get(pk=env.pk)))
