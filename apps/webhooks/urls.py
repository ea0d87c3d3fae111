"""API routes of webhooks (under /api/v1/)."""

from django.urls import path

from apps.core.urls import ENV
from apps.webhooks import api

urlpatterns = [
    path(f"{ENV}/webhooks", api.EndpointListApi.as_view(), name="webhook-list"),
    path("webhooks/<int:endpoint_id>", api.EndpointDetailApi.as_view(), name="webhook-detail"),
    path("webhooks/<int:endpoint_id>/rotate-secret", api.EndpointRotateApi.as_view(),
         name="webhook-rotate-secret"),
    path("webhooks/<int:endpoint_id>/deliveries", api.DeliveryListApi.as_view(),
         name="webhook-deliveries"),
]
