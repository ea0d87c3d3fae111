"""Dashboard pages: the overview, an environment's page and its actions."""

from django.contrib.auth import views as auth_views
from django.urls import path

from apps.dashboard import (
    audit_views,
    governance_views,
    history_views,
    rollout_views,
    snapshot_views,
    views,
    webhook_views,
)

app_name = "dashboard"

ENV = "e/<slug:application>/<slug:environment>/"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("login/", auth_views.LoginView.as_view(redirect_authenticated_user=True), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(ENV, views.environment_page, name="environment"),
    path(f"{ENV}diff/", snapshot_views.diff_page, name="diff"),
    path(f"{ENV}snapshots/", snapshot_views.snapshot_list, name="snapshots"),
    path(f"{ENV}publish/", snapshot_views.publish, name="publish"),
    path(f"{ENV}audit/", audit_views.audit_page, name="audit"),
    path(f"{ENV}descriptor/", views.descriptor_page, name="descriptor"),
    path(f"{ENV}deploy/", views.deploy, name="deploy"),
    path(f"{ENV}reset-inputs/", views.reset_inputs, name="reset-inputs"),
    path(f"{ENV}release-policy/", views.policy, {"field": "release_policy"},
         name="release-policy"),
    path(f"{ENV}drift-policy/", views.policy, {"field": "drift_policy"}, name="drift-policy"),
    path(f"{ENV}publications/<uuid:publication_id>/", views.publication_page,
         name="publication"),
    path(f"{ENV}snapshots/<int:number>/rollback/", views.snapshot_rollback_page,
         name="snapshot-rollback"),
    path(f"{ENV}rollouts/", rollout_views.rollout_history, name="rollouts"),
    path(f"{ENV}promote/", history_views.promote_page, name="promote"),
    path(f"{ENV}retention/", history_views.retention_page, name="retention"),
    path(f"{ENV}snapshots/<int:number>/remove/", history_views.snapshot_remove_view,
         name="snapshot-remove"),
    path(f"{ENV}publications/<uuid:publication_id>/confirm/",
         history_views.publication_confirm_view, name="publication-confirm"),
    path(f"{ENV}rollouts/new/", rollout_views.rollout_new, name="rollout-new"),
    path(f"{ENV}webhooks/", webhook_views.webhooks_page, name="webhooks"),
    path(f"{ENV}webhooks/delete/", webhook_views.webhook_delete, name="webhook-delete"),
    path(f"{ENV}rollouts/<int:rollout_id>/confirm/", rollout_views.rollout_confirm_view,
         name="rollout-confirm"),
    path(f"{ENV}rollouts/<int:rollout_id>/pause/", rollout_views.rollout_pause_view,
         name="rollout-pause"),
    path(f"{ENV}rollouts/<int:rollout_id>/resume/", rollout_views.rollout_resume_view,
         name="rollout-resume"),
    path(f"{ENV}rollouts/<int:rollout_id>/rollback/", rollout_views.rollout_rollback_view,
         name="rollout-rollback"),
    path(f"{ENV}rollouts/<int:rollout_id>/release-pins/", rollout_views.rollout_release_pins_view,
         name="rollout-release-pins"),
    path(f"{ENV}governance/", governance_views.governance_page, name="governance"),
    path(f"{ENV}governance/releases/<int:release_id>/approve/",
         governance_views.release_decide_view, {"decision": "approve"}, name="release-approve"),
    path(f"{ENV}governance/releases/<int:release_id>/reject/",
         governance_views.release_decide_view, {"decision": "reject"}, name="release-reject"),
    path(f"{ENV}governance/override/", governance_views.freeze_override_view,
         name="freeze-override"),
    path(f"{ENV}governance/schedules/<int:schedule_id>/cancel/",
         governance_views.schedule_cancel_view, name="schedule-cancel"),
]
