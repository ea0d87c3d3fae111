"""Webhook API (environment owners): register, list, read, change, rotate the secret
of and delete endpoints, and read an endpoint's delivery log."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response

from apps.core.errors import NotFound
from apps.core.events import DOMAIN_EVENTS
from apps.environments.models import Environment
from apps.environments.selectors import require_role
from apps.environments.views import EnvironmentAPIView
from apps.tenancy.models import Role
from apps.webhooks import services
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint


class EndpointSerializer(serializers.ModelSerializer):
    environment = serializers.CharField(source="environment.full_name")

    class Meta:
        model = WebhookEndpoint
        fields = ["id", "environment", "url", "events", "description", "enabled",
                  "next_sequence", "created_at"]


# Whitespace is not trimmed: the URL is refused with it (apps.webhooks.rules.url_problem).
class EndpointCreateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000, trim_whitespace=False)
    events = serializers.ListField(child=serializers.ChoiceField(DOMAIN_EVENTS),
                                   min_length=1, max_length=len(DOMAIN_EVENTS))
    description = serializers.CharField(max_length=200, required=False, allow_blank=True,
                                        default="")


class EndpointUpdateSerializer(serializers.Serializer):
    url = serializers.CharField(max_length=2000, required=False, trim_whitespace=False)
    events = serializers.ListField(child=serializers.ChoiceField(DOMAIN_EVENTS),
                                   min_length=1, max_length=len(DOMAIN_EVENTS), required=False)
    description = serializers.CharField(max_length=200, required=False, allow_blank=True)
    enabled = serializers.BooleanField(required=False)


class EndpointWithSecretSerializer(EndpointSerializer):
    secret = serializers.CharField(read_only=True)

    class Meta(EndpointSerializer.Meta):
        fields = [*EndpointSerializer.Meta.fields, "secret"]


class DeliverySerializer(serializers.ModelSerializer):
    class Meta:
        model = WebhookDelivery
        fields = ["id", "sequence", "event", "state", "attempts", "next_attempt_at",
                  "last_status", "last_error", "log", "created_at", "delivered_at"]


def _with_secret(endpoint: WebhookEndpoint, secret: str) -> dict:
    """The endpoint with its secret: the only answer that ever holds it."""
    return {**EndpointSerializer(endpoint).data, "secret": secret}


class EndpointListApi(EnvironmentAPIView, ListAPIView):
    serializer_class = EndpointSerializer

    def get_queryset(self):
        return (WebhookEndpoint.objects.filter(environment=self.environment(Role.OWNER))
                .select_related("environment__application"))

    @extend_schema(request=EndpointCreateSerializer,
                   responses={201: EndpointWithSecretSerializer},
                   summary="Register a webhook endpoint (its secret is shown this once)")
    def post(self, request, application, environment):
        env = self.environment(Role.OWNER)
        data = EndpointCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint, secret = services.endpoint_create(environment=env, actor=request.user,
                                                    **data.validated_data)
        return Response(_with_secret(endpoint, secret), status=status.HTTP_201_CREATED)


class _EndpointApi(EnvironmentAPIView):
    def endpoint(self) -> WebhookEndpoint:
        endpoint = WebhookEndpoint.objects.select_related("environment__application").filter(
            pk=self.kwargs["endpoint_id"],
            environment__in=Environment.objects.visible_to(self.request.user)).first()
        if endpoint is None:
            raise NotFound("Webhook endpoint not found.")
        require_role(user=self.request.user, environment=endpoint.environment,
                     required=Role.OWNER)
        return endpoint


class EndpointDetailApi(_EndpointApi):
    @extend_schema(responses=EndpointSerializer)
    def get(self, request, endpoint_id):
        return Response(EndpointSerializer(self.endpoint()).data)

    @extend_schema(request=EndpointUpdateSerializer, responses=EndpointSerializer,
                   summary="Change a webhook endpoint's URL, events, description or enabled")
    def patch(self, request, endpoint_id):
        endpoint = self.endpoint()
        data = EndpointUpdateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        endpoint, _ = services.endpoint_update(endpoint=endpoint, actor=request.user,
                                               **data.validated_data)
        return Response(EndpointSerializer(endpoint).data)

    @extend_schema(responses={204: None}, summary="Delete a webhook endpoint and its log")
    def delete(self, request, endpoint_id):
        services.endpoint_delete(endpoint=self.endpoint(), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class EndpointRotateApi(_EndpointApi):
    @extend_schema(request=None, responses=EndpointWithSecretSerializer,
                   summary="A new signing secret, shown this once")
    def post(self, request, endpoint_id):
        endpoint, secret = services.endpoint_update(endpoint=self.endpoint(),
                                                    actor=request.user, rotate_secret=True)
        return Response(_with_secret(endpoint, secret))


class DeliveryListApi(_EndpointApi, ListAPIView):
    serializer_class = DeliverySerializer

    def get_queryset(self):
        return WebhookDelivery.objects.filter(endpoint=self.endpoint()).order_by("-sequence")
