"""API routes of governance (under /api/v1/)."""

from django.urls import path

from apps.core.urls import ENV
from apps.governance import api

urlpatterns = [
    path(f"{ENV}/governance", api.GovernanceApi.as_view(), name="governance"),
    path(f"{ENV}/releases", api.ReleaseListApi.as_view(), name="release-list"),
    path(f"{ENV}/windows", api.WindowListApi.as_view(), name="window-list"),
    path(f"{ENV}/freeze-override", api.FreezeOverrideApi.as_view(), name="freeze-override"),
    path(f"{ENV}/schedules", api.ScheduleListApi.as_view(), name="schedule-list"),
    path("releases/<int:release_id>", api.ReleaseDetailApi.as_view(), name="release-detail"),
    path("releases/<int:release_id>/approve", api.ReleaseApproveApi.as_view(),
         name="release-approve"),
    path("releases/<int:release_id>/reject", api.ReleaseRejectApi.as_view(),
         name="release-reject"),
    path("releases/<int:release_id>/skip", api.ReleaseSkipApi.as_view(), name="release-skip"),
    path("releases/<int:release_id>/withdraw", api.ReleaseWithdrawApi.as_view(),
         name="release-withdraw"),
    path("releases/<int:release_id>/schedule", api.ReleaseScheduleApi.as_view(),
         name="release-schedule"),
    path("schedules/<int:schedule_id>/cancel", api.ScheduleCancelApi.as_view(),
         name="schedule-cancel"),
    path("windows/<int:window_id>", api.WindowDetailApi.as_view(), name="window-detail"),
]
