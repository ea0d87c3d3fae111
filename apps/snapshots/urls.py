"""API routes of snapshots and publications (under /api/v1/)."""

from django.urls import path

from apps.core.urls import ENV, SNAP
from apps.snapshots import api

urlpatterns = [
    path(f"{ENV}/preview", api.PreviewApi.as_view(), name="environment-preview"),
    path(f"{ENV}/pending", api.PendingChangesApi.as_view(), name="environment-pending"),
    path(f"{ENV}/reset-inputs", api.InputsResetApi.as_view(), name="environment-reset-inputs"),
    path(f"{ENV}/publish", api.PublishApi.as_view(), name="environment-publish"),
    path(f"{ENV}/snapshots", api.SnapshotListApi.as_view(), name="snapshot-list"),
    path(SNAP, api.SnapshotDetailApi.as_view(), name="snapshot-detail"),
    path(f"{SNAP}/diff", api.SnapshotDiffApi.as_view(), name="snapshot-diff"),
    path(f"{SNAP}/quarantine/lift", api.SnapshotQuarantineLiftApi.as_view(),
         name="snapshot-quarantine-lift"),
    path(f"{SNAP}/rollback", api.SnapshotRollbackApi.as_view(), name="snapshot-rollback"),
    path("publications/<uuid:publication_id>", api.PublicationDetailApi.as_view(),
         name="publication-detail"),
]
