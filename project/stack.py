"""The HTTP application around Django, as project/asgi.py serves it: the agents'
routes first (agentapi.routes), then every request body bounded
(project.bodylimits), then Django, a few requests at a time (project.admission)."""

from agentapi.routes import AgentRoutes
from project.admission import DjangoAdmission
from project.bodylimits import BoundedBodyASGI


def http_stack(django_app):
    return AgentRoutes(BoundedBodyASGI(DjangoAdmission(django_app)))
