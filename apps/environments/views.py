"""API view plumbing every app shares: a view on one environment named in the URL."""

from rest_framework import serializers
from rest_framework.views import APIView

from apps.core.errors import ValidationFailed
from apps.environments.models import Environment
from apps.environments.selectors import environment_get, require_role
from apps.tenancy.models import Role


class EnvironmentAPIView(APIView):
    """A view on one environment named in the URL as <application>/<environment>."""

    def environment(self, required: Role = Role.VIEWER) -> Environment:
        return environment_get(
            user=self.request.user,
            application=self.kwargs["application"],
            name=self.kwargs["environment"],
            required=required,
        )


class QuarantineOverrideSerializer(serializers.Serializer):
    """The fields every release (activate, push, pin, rollout) takes for the release
    gate: overriding a quarantine (an owner, with a reason), and `confirm`."""

    override_quarantine = serializers.BooleanField(default=False)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500,
                                   default="")
    confirm = serializers.BooleanField(
        default=False, help_text="Release a degenerate render (a file emptied, the files "
                                 "shrinking past the threshold, against the active "
                                 "snapshot): 409 confirmation_required without it.")


def quarantine_override(request, environment: Environment, data: dict) -> str | None:
    """The override's reason, or None without `override_quarantine`: overriding a
    quarantine needs the owner role (403) and a reason (400)."""
    if not data.get("override_quarantine"):
        return None
    require_role(user=request.user, environment=environment, required=Role.OWNER)
    reason = (data.get("reason") or "").strip()
    if not reason:
        raise ValidationFailed("override_quarantine needs a reason.", code="reason_required")
    return reason
