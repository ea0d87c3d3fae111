"""The app teams' dashboard: one view per page, a named partial for htmx requests,
every action a POST that calls a service (the same ones the API calls). Every input
comes through a form of apps.dashboard.forms.

An htmx action answers with the panel it changed plus the flash messages swapped
out of band, with the service's status code (htmx is configured to swap 4xx too);
a plain form post is redirected back to the page with the message. A page with a
form (descriptor, diff) answers htmx with its result and the form swapped out of
band, bound to what was sent, with its errors next to their fields.
"""

import logging
from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.csrf import csrf_failure as django_csrf_failure
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseClientRedirect, reswap

from apps.core.errors import ApplicationError, ValidationFailed
from apps.dashboard import forms, rollout_reads, selectors
from apps.environments.selectors import require_role
from apps.environments.services import descriptor_check
from apps.releases.services import (
    descriptor_submit,
    environment_inputs_reset,
    environment_update,
    snapshot_deploy,
    snapshot_rollback,
)
from apps.snapshots.guard import degenerate_findings
from apps.snapshots.models import Publication
from apps.snapshots.rules import degenerate_summary
from apps.snapshots.selectors import descriptor_dry_run, snapshot_get
from apps.tenancy.models import Role

logger = logging.getLogger(__name__)

PANELS = {
    "summary": lambda environment: {},  # the page head: the environment itself
    "agents": selectors.agents_panel,
    "snapshots": selectors.snapshots_panel,
    "pending": selectors.pending_panel,
    "rollout": rollout_reads.rollout_panel,
}


def _partial(request, template: str, partial: str) -> str:
    """The named partial for htmx, except when htmx restores history (it wants the page)."""
    return f"{template}#{partial}" if _wants_partial(request) else template


def _wants_partial(request) -> bool:
    return bool(request.htmx) and not request.htmx.history_restore_request


def _environment(request, application: str, environment: str):
    env = selectors.environment_for(request.user, application, environment)
    if env is None:
        raise Http404(f"Environment {application}/{environment} not found.")
    return env


def _page_context(request, env) -> dict:
    return {"environment": env, **selectors.permissions(request.user, env),
            "env_url": reverse("dashboard:environment", args=[env.application.name, env.name])}


def _explain(error: ApplicationError) -> str:
    if error.code == "stale":
        return (f"{error.message} Nothing was done: the panel now shows the current state; "
                "check it and try again.")
    return error.message


def _panel_html(request, env, panel: str) -> str:
    return render_to_string(f"dashboard/environment.html#{panel}",
                            {**_page_context(request, env), **PANELS[panel](env)},
                            request=request)


def _with_oob(request, html: str, oob: list[str], context: dict, status: int) -> HttpResponse:
    """`html` for htmx's target, then each partial of `oob` rendered to be swapped in
    out of band (they mark themselves so when `oob` is set)."""
    for partial in oob:
        html += render_to_string(partial, {**context, "oob": True}, request=request)
    return HttpResponse(html, status=status)


def _panel_response(request, env, panel: str, status: int = 200) -> HttpResponse:
    """The panel's partial, with the flash messages swapped in out of band."""
    return _with_oob(request, _panel_html(request, env, panel), ["dashboard/base.html#flash"],
                     {}, status)


def _form_page(request, template: str, result: str, context: dict,
               status: int = 200) -> HttpResponse:
    """A page with a form above its result: for htmx the result partial (its target)
    and the form swapped out of band, bound, with its errors next to its fields."""
    if not _wants_partial(request):
        return render(request, template, context, status=status)
    return _with_oob(request, render_to_string(f"{template}#{result}", context, request=request),
                     [f"{template}#form"], context, status)


def _render_environment(request, env, status: int = 200) -> HttpResponse:
    context = _page_context(request, env)
    for build in PANELS.values():
        context.update(build(env))
    return render(request, "dashboard/environment.html", context, status=status)


def _act(request, env, panel: str, action, form: forms.DashboardForm | None = None,
         *, required: Role = Role.DEPLOYER) -> HttpResponse:
    """Run `action` (a service call) for a user with the `required` role (whose
    refusal names it) once `form` is valid;
    answer with the changed panel (htmx), or the page: redirected to after a success,
    with the refusal and its status after a refusal (plain form). The form's fields
    are hidden inputs of the buttons: its errors go to the flash (a 400)."""
    status = 200
    try:
        require_role(user=request.user, environment=env, required=required)
        if form is not None and not form.is_valid():
            for line in form.error_lines():
                messages.error(request, line)
            status = 400
        else:
            done = action()
            if done:
                messages.success(request, done)
    except ApplicationError as error:
        logger.info("dashboard %s refused for %s: %s", request.path, request.user, error.message)
        messages.error(request, _explain(error))
        status = error.status
    env = _environment(request, env.application.name, env.name)  # as the action left it
    if request.htmx:
        return _panel_response(request, env, panel, status)
    if status != 200:
        return _render_environment(request, env, status)
    return redirect(_page_context(request, env)["env_url"])


@login_required
@require_GET
@vary_on_headers("HX-Request")
def overview(request):
    context = {"rows": selectors.overview_for(request.user)}
    return render(request, _partial(request, "dashboard/overview.html", "environments"), context)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def environment_page(request, application, environment):
    env = _environment(request, application, environment)
    panel = request.GET.get("panel")
    if panel in PANELS and _wants_partial(request):
        return HttpResponse(_panel_html(request, env, panel))
    return _render_environment(request, env)


def _check_target(descriptor: dict, env) -> None:
    if (descriptor["application"], descriptor["environment"]) != (env.application.name,
                                                                  env.name):
        raise ValidationFailed(
            f"The descriptor is for {descriptor['application']}/{descriptor['environment']}, "
            f"not {env.full_name}.", code="descriptor_invalid",
            details=[{"key": "environment", "message": f"expected {env.full_name}"}])


@login_required
@require_http_methods(["GET", "POST"])
def descriptor_page(request, application, environment):
    """Paste or upload -> preview (effective config, provenance, diff) -> publish."""
    env = _environment(request, application, environment)
    context = _page_context(request, env)
    if request.method == "GET":
        context["form"] = forms.DescriptorForm(environment=env)
        return render(request, "dashboard/descriptor.html", context)
    form = context["form"] = forms.DescriptorForm(request.POST, request.FILES, environment=env)
    status = 200
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        if form.is_valid():
            descriptor = form.cleaned_data["parsed"]
            descriptor_check(descriptor)
            _check_target(descriptor, env)
            context["text"] = form.cleaned_data["text"]
            if form.cleaned_data["step"] == "publish":
                publication, created = descriptor_submit(
                    environment=env, descriptor=descriptor, actor=request.user,
                    confirmed=form.cleaned_data["confirm"])
                publication.refresh_from_db()
                messages.add_message(request, *_publication_message(publication, created))
                where = _after_publish(env, publication) or context["env_url"]
                if request.htmx:
                    return HttpResponseClientRedirect(where)
                return redirect(where)
            context["preview"] = descriptor_dry_run(env, descriptor)
        else:
            status = 400
    except ApplicationError as error:
        status = error.status
        if not form.add_refusal(error):
            context["error"] = error
    return _form_page(request, "dashboard/descriptor.html", "preview", context, status)


def _after_publish(env, publication: Publication) -> str | None:
    """Where a publish in a staged environment leads: while it renders, to its page
    (which offers the rollout once it is stored); once stored, straight to the
    rollout form with its snapshot chosen; held for a confirmation, to its page
    (which says why and confirms), or held by the release gate (approvals, a
    freeze), to its page too. None: back to the environment."""
    args = [env.application.name, env.name]
    if (publication.needs_confirmation and not publication.confirmed) or publication.held:
        return reverse("dashboard:publication", args=[*args, publication.pk])
    if not env.is_staged or publication.activated:
        return None
    if publication.state == Publication.State.RENDERING:
        return reverse("dashboard:publication", args=[*args, publication.pk])
    if selectors.rollout_offers(env, publication.snapshot):
        return (reverse("dashboard:rollout-new", args=args)
                + f"?snapshot={publication.snapshot.number}")
    return None


def _publication_message(publication: Publication, created: bool) -> tuple[int, str]:
    if publication.state == Publication.State.RENDERING:
        return messages.INFO, "Queued for rendering; the snapshot list updates when it is ready."
    number = publication.snapshot.number
    if publication.state == Publication.State.READY and created and not publication.activates:
        return messages.SUCCESS, (f"Published #{number}: stored, not active (the release "
                                  "policy is staged). Start a rollout of it.")
    if publication.state == Publication.State.INVALID:
        return messages.ERROR, (f"#{number} is invalid and was not activated; its report "
                                "is in the admin's snapshots and the API.")
    if publication.state == Publication.State.SUPERSEDED:
        return messages.WARNING, f"A later request finished first as #{number}."
    if publication.needs_confirmation and not publication.confirmed:
        return messages.WARNING, (f"#{number} is stored and held: its render looks "
                                  "degenerate. Open its publication to see why and confirm.")
    if publication.held:
        return messages.WARNING, (f"Published #{number}, not activated: "
                                  f"{publication.held['message']}")
    if not created:
        return messages.INFO, f"This descriptor was already published as #{number}."
    return messages.SUCCESS, f"Published #{number}."


def _signed_in_action(view):
    """login_required for a POST-only action: after signing in, the user comes back
    to the environment's page (a GET of the action itself would be refused)."""
    @wraps(view)
    def wrapper(request, application, environment, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(reverse("dashboard:environment",
                                             args=[application, environment]))
        return view(request, application, environment, *args, **kwargs)
    return wrapper


@_signed_in_action
@require_POST
def deploy(request, application, environment):
    """Deploy now: push a snapshot (default: the active one) to one agent or all."""
    env = _environment(request, application, environment)
    form = forms.DeployForm(request.POST, active=env.active_snapshot)

    def push():
        snapshot = snapshot_get(environment=env, number=form.cleaned_data["snapshot"])
        agent = form.cleaned_data["agent"]
        deployments = snapshot_deploy(snapshot=snapshot, actor=request.user,
                                      agent_ids=None if agent is None else [agent],
                                      confirmed=form.cleaned_data["confirm"])
        return f"Pushed #{snapshot.number} to {len(deployments)} agent(s)."

    return _act(request, env, "agents", push, form)


@login_required
@require_http_methods(["GET", "POST"])
def snapshot_rollback_page(request, application, environment, number):
    """Roll back to a snapshot: a confirmation page, then a new, higher snapshot."""
    env = _environment(request, application, environment)
    try:
        snapshot = snapshot_get(environment=env, number=number)
    except ApplicationError as error:
        raise Http404(error.message) from None
    findings = degenerate_findings(env, snapshot.files)  # the page warns before asking
    form = forms.RollbackForm(request.POST if request.method == "POST" else None)
    context = {**_page_context(request, env), "snapshot": snapshot, "form": form,
               "degenerate": degenerate_summary(findings) if findings else None}
    if request.method == "GET":
        return render(request, "dashboard/rollback.html", context)

    def roll_back():
        publication = snapshot_rollback(snapshot=snapshot, actor=request.user,
                                        confirmed=form.cleaned_data["confirm"])
        publication.refresh_from_db()
        if publication.state == Publication.State.READY:
            return f"Rolled back to #{snapshot.number} as #{publication.snapshot.number}."
        return _publication_message(publication, True)[1]

    return _act(request, env, "snapshots", roll_back, form)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def publication_page(request, application, environment, publication_id):
    """A publication while it renders, then what it stored and, in a staged
    environment, the way to start a rollout of it."""
    env = _environment(request, application, environment)
    publication = selectors.publication_in(env, publication_id)
    if publication is None:
        raise Http404("Publication not found.")
    context = {**_page_context(request, env), "publication": publication,
               "rollout_url": _after_publish(env, publication)
               if publication.state == Publication.State.READY else None,
               "page_url": request.path}
    partial = "publication" if request.GET.get("panel") == "publication" else None
    return render(request, "dashboard/publication.html" + (f"#{partial}" if partial and
                                                           _wants_partial(request) else ""),
                  context)


# The environment's policies an owner changes from its page: field -> (form, what it is).
POLICIES = {"release_policy": (forms.ReleasePolicyForm, "Release policy"),
            "drift_policy": (forms.DriftPolicyForm, "Drift policy")}


@_signed_in_action
@require_POST
def policy(request, application, environment, field):
    """Change one of the environment's policies (owners), at the version the page showed."""
    env = _environment(request, application, environment)
    form_class, what = POLICIES[field]
    form = form_class(request.POST)

    def change():
        changed = environment_update(
            environment=env, actor=request.user, expected_version=form.cleaned_data[
                "expected_version"], **{field: form.cleaned_data[field]})
        return f"{what}: {getattr(changed, f'get_{field}_display')()}."

    return _act(request, env, "summary", change, form, required=Role.OWNER)


@_signed_in_action
@require_POST
def reset_inputs(request, application, environment):
    """Reset the environment's inputs to the active snapshot's source (owners)."""
    env = _environment(request, application, environment)

    def reset():
        environment_inputs_reset(environment=env, actor=request.user)
        return f"Inputs reset to #{env.active_snapshot.number}'s source."

    return _act(request, env, "pending", reset, required=Role.OWNER)


def csrf_failure(request, reason=""):
    """CSRF_FAILURE_VIEW: an htmx request whose token went stale (signed in again in
    another tab) gets the reason in the flash and changes nothing on the page."""
    if not request.htmx:
        return django_csrf_failure(request, reason)
    messages.error(request, "This page's session has changed (signed in again "
                            "elsewhere?). Nothing was done: reload the page and try again.")
    return reswap(HttpResponse(render_to_string("dashboard/base.html#flash", {"oob": True},
                                                request=request), status=403), "none")
