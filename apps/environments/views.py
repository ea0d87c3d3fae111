"""API view plumbing every app shares: a view on one environment named in the URL."""

from rest_framework.views import APIView

from apps.environments.models import Environment
from apps.environments.selectors import environment_get
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
