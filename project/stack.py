"""The HTTP application around Django, as project/asgi.py serves it: the agents'
routes first (agentapi), then every request body bounded (project.bodylimits),
then Django, a few requests at a time (project.admission)."""

from agentapi.bundle import BundleRoute
from agentapi.edge import PollEdge
from agentapi.report_edge import ReportEdge
from project.admission import DjangoAdmission
from project.bodylimits import BoundedBodyASGI


def http_stack(django_app):
    return PollEdge(BundleRoute(BoundedBodyASGI(ReportEdge(DjangoAdmission(django_app)))))
