"""The dashboard's audit page: an environment's audit log, newest first, a page at a
time, filtered by kind; viewers of the environment see it, like the API's."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET
from django.views.decorators.vary import vary_on_headers

from apps.dashboard import audit_reads
from apps.dashboard.views import _environment, _page_context, _partial


@login_required
@require_GET
@vary_on_headers("HX-Request")
def audit_page(request, application, environment):
    """?kind= one of audit_reads.KINDS (anything else: every kind), ?page=N."""
    env = _environment(request, application, environment)
    kind = request.GET.get("kind", "")
    kind = kind if kind in audit_reads.KINDS else ""
    context = {**_page_context(request, env), "kind": kind, "kinds": audit_reads.KINDS,
               **audit_reads.audit_page(env, kind, request.GET.get("page"))}
    return render(request, _partial(request, "dashboard/audit.html", "list"), context)
