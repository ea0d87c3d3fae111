"""The agents' routes, each answered in this package alone, in front of the rest of
the site: the poll (agentapi.cached), a snapshot's bundle (agentapi.bundle) and
reports (agentapi.reports, their bodies received by project.bodylimits first)."""

from agentapi.bundle import BUNDLE_PATH, answer_bundle
from agentapi.cached import DESIRED_PATH, answer_poll
from agentapi.reports import REPORTS_PATH, answer_report
from project.bodylimits import BoundedBodyASGI


class AgentRoutes:
    """ASGI: an agent route's request answered here; any other handed to `app`."""

    def __init__(self, app):
        self.app = app
        self.report = BoundedBodyASGI(answer_report)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            path = scope["path"]
            if path == DESIRED_PATH:
                return await answer_poll(scope, receive, send)
            if path == REPORTS_PATH:
                return await self.report(scope, receive, send)
            if BUNDLE_PATH.fullmatch(path):
                return await answer_bundle(scope, receive, send)
        return await self.app(scope, receive, send)
