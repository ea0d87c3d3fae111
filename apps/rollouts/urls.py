"""API routes of rollouts (under /api/v1/)."""

from django.urls import path

from apps.core.urls import ENV
from apps.rollouts import api

urlpatterns = [
    path(f"{ENV}/rollouts", api.RolloutListApi.as_view(), name="rollout-list"),
    path("rollouts/<int:rollout_id>", api.RolloutDetailApi.as_view(), name="rollout-detail"),
    path("rollouts/<int:rollout_id>/confirm", api.RolloutConfirmApi.as_view(),
         name="rollout-confirm"),
    path("rollouts/<int:rollout_id>/pause", api.RolloutPauseApi.as_view(), name="rollout-pause"),
    path("rollouts/<int:rollout_id>/resume", api.RolloutResumeApi.as_view(),
         name="rollout-resume"),
    path("rollouts/<int:rollout_id>/rollback", api.RolloutRollbackApi.as_view(),
         name="rollout-rollback"),
    path("rollouts/<int:rollout_id>/release-pins", api.RolloutReleasePinsApi.as_view(),
         name="rollout-release-pins"),
    path("strategies", api.StrategyListApi.as_view(), name="strategy-list"),
    path("strategies/<int:strategy_id>", api.StrategyDetailApi.as_view(),
         name="strategy-detail"),
    path(f"{ENV}/default-strategy", api.EnvironmentStrategyApi.as_view(),
         name="environment-default-strategy"),
]
