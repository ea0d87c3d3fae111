"""API routes of environments (under /api/v1/)."""

from django.urls import path

from apps.core.urls import ENV
from apps.environments import api

urlpatterns = [
    path("environments", api.EnvironmentListApi.as_view(), name="environment-list"),
    path(ENV, api.EnvironmentDetailApi.as_view(), name="environment-detail"),
    path(f"{ENV}/templates/<path:path>", api.TemplateApi.as_view(), name="template"),
    path(f"{ENV}/fallback-files/<path:path>", api.FallbackFileApi.as_view(),
         name="fallback-file"),
    path("descriptors", api.DescriptorSubmitApi.as_view(), name="descriptor-submit"),
]
