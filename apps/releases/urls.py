"""API routes of releases: promotion, retention, confirmations (under /api/v1/)."""

from django.urls import path

from apps.core.urls import ENV, SNAP
from apps.releases import api

urlpatterns = [
    path(f"{ENV}/promotion", api.PromotionPreviewApi.as_view(), name="environment-promotion"),
    path(f"{ENV}/promote", api.PromoteApi.as_view(), name="environment-promote"),
    path(f"{ENV}/retention", api.RetentionApi.as_view(), name="environment-retention"),
    path(f"{SNAP}/remove", api.SnapshotRemoveApi.as_view(), name="snapshot-remove"),
    path("publications/<uuid:publication_id>/confirm", api.PublicationConfirmApi.as_view(),
         name="publication-confirm"),
]
