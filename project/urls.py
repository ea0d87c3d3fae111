"""URL configuration: admin, the REST API under /api/v1/, its schema and docs."""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.audit import api as audit_api
from apps.environments import api as environments_api
from apps.snapshots import api as snapshots_api

ENV = "environments/<slug:application>/<slug:environment>"
SNAP = f"{ENV}/snapshots/<int:number>"

api_v1 = [
    path("environments", environments_api.EnvironmentListApi.as_view(), name="environment-list"),
    path(ENV, environments_api.EnvironmentDetailApi.as_view(), name="environment-detail"),
    path(f"{ENV}/templates/<path:path>", environments_api.TemplateApi.as_view(),
         name="template"),
    path(f"{ENV}/fallback-files/<path:path>", environments_api.FallbackFileApi.as_view(),
         name="fallback-file"),
    path(f"{ENV}/preview", snapshots_api.PreviewApi.as_view(), name="environment-preview"),
    path(f"{ENV}/publish", snapshots_api.PublishApi.as_view(), name="environment-publish"),
    path(f"{ENV}/pending", audit_api.PendingChangesApi.as_view(), name="environment-pending"),
    path(f"{ENV}/audit", audit_api.AuditListApi.as_view(), name="environment-audit"),
    path(f"{ENV}/snapshots", snapshots_api.SnapshotListApi.as_view(), name="snapshot-list"),
    path(SNAP, snapshots_api.SnapshotDetailApi.as_view(), name="snapshot-detail"),
    path(f"{SNAP}/diff", snapshots_api.SnapshotDiffApi.as_view(), name="snapshot-diff"),
    path(f"{SNAP}/rollback", snapshots_api.SnapshotRollbackApi.as_view(),
         name="snapshot-rollback"),
    path("publications/<uuid:publication_id>", snapshots_api.PublicationDetailApi.as_view(),
         name="publication-detail"),
]

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="v1")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
]

handler404 = "apps.core.handlers.not_found"
handler500 = "apps.core.handlers.server_error"
