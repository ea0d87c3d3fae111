"""Release API: promotion (preview, promote), retention (usage and holds, an
owner's removal of a snapshot) and the confirmation of a held publication."""

from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import NotFound, ValidationFailed
from apps.core.fields import WholeNumberField
from apps.core.queries import query_number, query_value
from apps.environments.models import Environment
from apps.environments.selectors import environment_get, require_role
from apps.environments.views import EnvironmentAPIView
from apps.releases import retention
from apps.releases.promotion import publication_confirm, snapshot_promote
from apps.releases.selectors import retention_usage
from apps.snapshots.api import PublicationSerializer, publication_response
from apps.snapshots.guard_api import ConfirmSerializer
from apps.snapshots.models import Publication, Snapshot
from apps.snapshots.promotion import promoted_snapshot, promotion_preview
from apps.snapshots.selectors import snapshot_get
from apps.tenancy.models import Role, slug_validator

NUMBER_MAX = 2**31 - 1
HOLDS_SHOWN = 500  # the oldest snapshots, where retention looks first


def _source(request, target: Environment, name: str) -> Environment:
    """The environment promoted from: `name` of the target's application, or
    `application/name`; 404 unless the user sees it, 400 when it is malformed."""
    application, _, short = name.rpartition("/")
    application = application or target.application.name
    for part in (application, short):
        try:
            slug_validator(part)
        except Exception:
            raise ValidationFailed("from: an environment name (or application/name).",
                                   details=[{"field": "from", "message": "not a name"}]) from None
    return environment_get(user=request.user, application=application, name=short)


class PromotionPreviewSerializer(serializers.Serializer):
    promoted_from = serializers.JSONField()
    valid = serializers.BooleanField()
    errors = serializers.JSONField()
    checksum = serializers.CharField(allow_null=True)
    provenance = serializers.DictField(child=serializers.CharField())
    against = WholeNumberField(allow_null=True)
    files = serializers.JSONField(help_text="The diff of the active snapshot against what "
                                            "this environment would render.")
    rendered_files = serializers.JSONField()


class PromotionPreviewApi(EnvironmentAPIView):
    @extend_schema(parameters=[OpenApiParameter("from", str, required=True),
                               OpenApiParameter("number", int)],
                   responses=PromotionPreviewSerializer,
                   summary="What promoting another environment's active snapshot here would "
                           "publish, as a diff against the active one; records nothing")
    def get(self, request, application, environment):
        target = self.environment()
        name = query_value(request, "from")
        if not name:
            raise ValidationFailed("from is required.", details=[{"field": "from",
                                                                  "message": "required"}])
        promoted = promoted_snapshot(source=_source(request, target, name), target=target,
                                     expected_number=query_number(request, "number", minimum=1,
                                                                  maximum=NUMBER_MAX))
        return Response(promotion_preview(environment=target, promoted=promoted))


class PromoteApi(EnvironmentAPIView):
    class PromoteSerializer(ConfirmSerializer):
        source = serializers.CharField(max_length=129, help_text=(
            "The environment promoted from: a name of this application, or application/name."))
        number = WholeNumberField(required=False, min_value=1, max_value=NUMBER_MAX,
                                  help_text="The snapshot you expect it to run (409 stale "
                                            "when it runs another).")

        def get_fields(self):
            fields = super().get_fields()
            fields["from"] = fields.pop("source")
            return fields

    @extend_schema(request=PromoteSerializer, responses={201: PublicationSerializer,
                                                         202: PublicationSerializer},
                   summary="Publish here what another environment runs (its release applied "
                           "to this environment's own config)")
    def post(self, request, application, environment):
        target = self.environment(Role.DEPLOYER)
        data = self.PromoteSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        publication = snapshot_promote(source=_source(request, target, values["from"]),
                                       target=target, actor=request.user,
                                       expected_number=values.get("number"),
                                       confirmed=values["confirm"])
        return publication_response(publication)


class RetentionApi(EnvironmentAPIView):
    @extend_schema(responses={200: None},
                   summary="Stored snapshots, bytes and finished rollouts against the "
                           "environment's bounds, and what keeps each old snapshot")
    def get(self, request, application, environment):
        env = self.environment()
        oldest = list(Snapshot.objects.filter(environment=env).with_stored_bytes()
                      .order_by("number").values_list("pk", "number", "stored_bytes")
                      [:HOLDS_SHOWN])
        with transaction.atomic():  # a consistent read; retention itself locks
            holds = retention.snapshot_holds(env, [pk for pk, _, _ in oldest])
        return Response({**retention_usage(env), "snapshots_oldest_first": [
            {"number": number, "bytes": size, "holds": holds[pk]}
            for pk, number, size in oldest]})


class SnapshotRemoveApi(EnvironmentAPIView):
    class RemoveSerializer(serializers.Serializer):
        reason = serializers.CharField(max_length=500, help_text="Why (audited); required.")

    @extend_schema(request=RemoveSerializer, responses={204: None},
                   summary="Remove snapshot n (owners, with a reason); 409 snapshot_kept when "
                           "something still holds it")
    def post(self, request, application, environment, number):
        env = self.environment(Role.OWNER)
        data = self.RemoveSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        retention.snapshot_remove(snapshot=snapshot_get(environment=env, number=number),
                                  actor=request.user, reason=data.validated_data["reason"])
        return Response(status=204)


class PublicationConfirmApi(APIView):
    @extend_schema(request=None, responses={200: PublicationSerializer},
                   summary="Confirm a publication held for its degenerate render (and "
                           "activate it when it was meant to)")
    def post(self, request, publication_id):
        publication = (Publication.objects.filter(
            pk=publication_id, environment__in=Environment.objects.visible_to(request.user))
            .select_related("environment__application__tenant").first())
        if publication is None:
            raise NotFound("Publication not found.")
        require_role(user=request.user, environment=publication.environment,
                     required=Role.DEPLOYER)
        publication_confirm(publication=publication, actor=request.user)
        return publication_response(Publication.objects.get(pk=publication.pk), repeated=True)
