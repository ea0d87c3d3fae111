"""API routes of the audit log (under /api/v1/)."""

from django.urls import path

from apps.audit import api
from apps.core.urls import ENV

urlpatterns = [
    path(f"{ENV}/audit", api.AuditListApi.as_view(), name="environment-audit"),
]
