"""URL configuration: admin, the REST API under /api/v1/, its schema and docs."""

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from apps.audit import api as audit_api
from apps.core.handlers import healthz, not_found_api
from apps.environments import api as environments_api
from apps.fleet import agent_api
from apps.fleet import api as fleet_api
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
    # Fleet (operators)
    path(f"{ENV}/agents", fleet_api.AgentListApi.as_view(), name="agent-list"),
    path(f"{ENV}/enrollment-tokens", fleet_api.EnrollmentTokenApi.as_view(),
         name="enrollment-token-create"),
    path(f"{SNAP}/activate", fleet_api.SnapshotActivateApi.as_view(), name="snapshot-activate"),
    path(f"{SNAP}/deploy", fleet_api.SnapshotDeployApi.as_view(), name="snapshot-deploy"),
    path("agents/<int:agent_id>", fleet_api.AgentDetailApi.as_view(), name="agent-detail"),
    path("agents/<int:agent_id>/deployments", fleet_api.AgentDeploymentListApi.as_view(),
         name="agent-deployments"),
    path("agents/<int:agent_id>/token/rotate", fleet_api.AgentTokenRotateApi.as_view(),
         name="agent-token-rotate"),
    path("agents/<int:agent_id>/token/revoke", fleet_api.AgentTokenRevokeApi.as_view(),
         name="agent-token-revoke"),
    # The agent protocol
    path("agent/enroll", agent_api.EnrollApi.as_view(), name="agent-enroll"),
    path("agent/desired", agent_api.desired_view, name="agent-desired"),
    path("agent/snapshots/<int:number>/bundle", agent_api.BundleApi.as_view(),
         name="agent-bundle"),
    path("agent/reports", agent_api.ReportApi.as_view(), name="agent-reports"),
]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/v1/", include((api_v1, "api"), namespace="v1")),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # Unknown API paths answer with the JSON envelope in every mode (handler404
    # only applies with DEBUG off).
    re_path(r"^api/", not_found_api),
]

handler404 = "apps.core.handlers.not_found"
handler500 = "apps.core.handlers.server_error"
