"""API routes of the fleet (under /api/v1/): operators' routes and the agent protocol."""

from django.urls import path

from apps.core.urls import ENV, SNAP
from apps.fleet import agent_api, api

urlpatterns = [
    path(f"{ENV}/agents", api.AgentListApi.as_view(), name="agent-list"),
    path(f"{ENV}/enrollment-tokens", api.EnrollmentTokenApi.as_view(),
         name="enrollment-token-create"),
    path(f"{SNAP}/activate", api.SnapshotActivateApi.as_view(), name="snapshot-activate"),
    path(f"{SNAP}/deploy", api.SnapshotDeployApi.as_view(), name="snapshot-deploy"),
    path("agents/<int:agent_id>", api.AgentDetailApi.as_view(), name="agent-detail"),
    path("agents/<int:agent_id>/deployments", api.AgentDeploymentListApi.as_view(),
         name="agent-deployments"),
    path("agents/<int:agent_id>/token/rotate", api.AgentTokenRotateApi.as_view(),
         name="agent-token-rotate"),
    path("agents/<int:agent_id>/token/revoke", api.AgentTokenRevokeApi.as_view(),
         name="agent-token-revoke"),
    path("agents/<int:agent_id>/decommission", api.AgentDecommissionApi.as_view(),
         name="agent-decommission"),
    path("agents/<int:agent_id>/pin", api.AgentPinApi.as_view(), name="agent-pin"),
    path("agents/<int:agent_id>/pin/release", api.AgentPinReleaseApi.as_view(),
         name="agent-pin-release"),
    # The agent protocol (docs/design.md)
    path("agent/enroll", agent_api.EnrollApi.as_view(), name="agent-enroll"),
    path("agent/drift", agent_api.DriftApi.as_view(), name="agent-drift"),
]
