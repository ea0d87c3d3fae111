"""The dashboard's governance page: an environment's approval rule and freeze
status, its releases with approve / reject (with a comment), its freezes and allow
windows, its scheduled releases, and an owner's emergency override. Every action is
a POST calling the governance services (the API calls the same); htmx gets the
page's `governance` partial back with the flash swapped out of band."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from apps.core.errors import ApplicationError
from apps.dashboard.forms import DashboardForm
from apps.dashboard.governance_forms import DecisionForm, OverrideForm
from apps.dashboard.views import _environment, _page_context, _signed_in_action, _wants_partial
from apps.environments.selectors import require_role
from apps.governance import schedules, selectors, services, windows
from apps.governance.models import ReleaseRequest, ReleaseWindow, ScheduledRelease
from apps.tenancy.models import Role

TEMPLATE = "dashboard/governance.html"


def _context(request, env) -> dict:
    releases = list(ReleaseRequest.objects.filter(environment=env)
                    .select_related("snapshot", "requested_by", "environment__application")[:20])
    return {**_page_context(request, env),
            "governance_url": reverse("dashboard:governance",
                                      args=[env.application.name, env.name]),
            "rule": selectors.rule_of(env.pk), "frozen": selectors.freeze_in_force(env),
            "releases": [(r, selectors.approval_missing(r)) for r in releases],
            "windows": list(ReleaseWindow.objects.filter(environment=env)),
            "schedules": list(ScheduledRelease.objects.filter(environment=env)
                              .select_related("release__snapshot").order_by("-run_at")[:20])}


@login_required
@require_GET
@vary_on_headers("HX-Request")
def governance_page(request, application, environment):
    env = _environment(request, application, environment)
    template = f"{TEMPLATE}#governance" if _wants_partial(request) else TEMPLATE
    return render(request, template, _context(request, env))


def _answer(request, env, status: int = 200) -> HttpResponse:
    if not _wants_partial(request):
        return redirect(reverse("dashboard:governance", args=[env.application.name, env.name]))
    html = render_to_string(f"{TEMPLATE}#governance", _context(request, env), request=request)
    html += render_to_string("dashboard/base.html#flash", {"oob": True}, request=request)
    return HttpResponse(html, status=status)


def _run(request, env, action, form, required: Role) -> HttpResponse:
    """Run `action` once the form is valid and the role held; the refusal or the
    success goes to the flash."""
    status = 200
    try:
        require_role(user=request.user, environment=env, required=required)
        if not form.is_valid():
            for line in form.error_lines():
                messages.error(request, line)
            return _answer(request, env, 400)
        messages.success(request, action(form.cleaned_data))
    except ApplicationError as error:
        messages.error(request, error.message)
        status = error.status
    return _answer(request, env, status)


def _release(env, release_id: int) -> ReleaseRequest:
    release = (ReleaseRequest.objects.select_related("snapshot", "environment__application")
               .filter(pk=release_id, environment=env).first())
    if release is None:
        raise Http404("Release not found.")
    return release


@_signed_in_action
@require_POST
def release_decide_view(request, application, environment, release_id, decision):
    env = _environment(request, application, environment)
    release = _release(env, release_id)

    def decide(data):
        services.release_decide(release=release, actor=request.user, decision=decision,
                                checksum=data["checksum"], plan_digest=data["plan_digest"],
                                comment=data["comment"])
        return f"Release {release.pk} {decision}d."

    return _run(request, env, decide, DecisionForm(request.POST), Role.VIEWER)


@_signed_in_action
@require_POST
def freeze_override_view(request, application, environment):
    env = _environment(request, application, environment)

    def override(data):
        done = windows.freeze_override(environment=env, actor=request.user,
                                       reason=data["reason"], minutes=data["minutes"])
        return f"Freezes overridden until {done.ends_at:%H:%M} UTC."

    return _run(request, env, override, OverrideForm(request.POST), Role.OWNER)


@_signed_in_action
@require_POST
def schedule_cancel_view(request, application, environment, schedule_id):
    env = _environment(request, application, environment)
    schedule = ScheduledRelease.objects.filter(pk=schedule_id, environment=env).first()
    if schedule is None:
        raise Http404("Scheduled release not found.")

    def cancel(data):
        schedules.schedule_cancel(schedule=schedule, actor=request.user)
        return f"Scheduled release {schedule.pk} cancelled."

    return _run(request, env, cancel, DashboardForm(data={}), Role.DEPLOYER)
