"""URL configuration: admin, the REST API under /api/v1/ (each app's urls), its
schema and docs, /healthz (liveness), /readyz (readiness), /metrics (Prometheus),
and the dashboard at the root."""

from csp.decorators import csp_update
from django.contrib import admin
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from apps.core.handlers import favicon, healthz, not_found_api, readyz
from project.metrics import metrics

API_APPS = ["environments", "snapshots", "audit", "fleet", "rollouts", "releases",
            "webhooks", "governance"]

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("readyz", readyz, name="readyz"),
    path("favicon.ico", favicon),
    path("metrics", csrf_exempt(metrics), name="metrics"),
    path("admin/", admin.site.urls),
    *[path("api/v1/", include(f"apps.{app}.urls")) for app in API_APPS],
    path("api/schema/", SpectacularAPIView.as_view(urlconf="project.schema_urls"),
         name="schema"),
    # Its script is served apart (the CSP allows no inline script); Swagger UI styles
    # itself inline, so this page alone allows inline styles.
    path("api/docs/", csp_update({"style-src": ["'unsafe-inline'"]})(
        SpectacularSwaggerSplitView.as_view(url_name="schema")), name="api-docs"),
    # Unknown API paths answer with the JSON envelope in every mode (handler404
    # only applies with DEBUG off), for every method: no CSRF page before it.
    re_path(r"^api/", csrf_exempt(not_found_api)),
    path("", include("apps.dashboard.urls")),
]

handler400 = "apps.core.handlers.bad_request"
handler404 = "apps.core.handlers.not_found"
handler500 = "apps.core.handlers.server_error"
