"""The app teams' dashboard: one view per page, a named partial for htmx requests,
every action a POST that calls a service (the same ones the API calls).

An htmx action answers with the panel it changed plus the flash messages swapped
out of band, with the service's status code (htmx is configured to swap 4xx too);
a plain form post is redirected back to the page with the message.
"""

import logging
from functools import wraps

from django.conf import settings
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

from apps.core.errors import ApplicationError, ValidationFailed
from apps.dashboard import selectors
from apps.environments.selectors import require_role
from apps.environments.services import descriptor_check
from apps.releases.services import descriptor_submit, snapshot_deploy, snapshot_rollback
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_confirm, rollout_create, rollout_rollback
from apps.snapshots.models import Publication
from apps.snapshots.selectors import descriptor_dry_run, snapshot_diff, snapshot_get
from apps.tenancy.models import Role
from configlang.yamlconfig import load_yaml

logger = logging.getLogger(__name__)

PANELS = {
    "summary": lambda environment: {},  # the page head: the environment itself
    "agents": selectors.agents_panel,
    "snapshots": selectors.snapshots_panel,
    "pending": selectors.pending_panel,
    "rollout": selectors.rollout_panel,
}
MAX_DESCRIPTOR_BYTES = 256 * 1024


def _number(text: str | None, field: str, message: str, maximum: int = 2**31 - 1) -> int:
    """A form field's positive whole number (ASCII digits, bounded), else a 400."""
    if not text or not (text.isascii() and text.isdigit()) or not 1 <= int(text) <= maximum:
        raise ValidationFailed(f"{field}: {message}", code="invalid",
                               details=[{"key": field, "message": message}])
    return int(text)


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
    return {"environment": env, "can_deploy": selectors.may_deploy(request.user, env),
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


def _panel_response(request, env, panel: str, status: int = 200) -> HttpResponse:
    """The panel's partial, with the flash messages swapped in out of band."""
    html = _panel_html(request, env, panel)
    html += render_to_string("dashboard/base.html#flash", {"oob": True}, request=request)
    return HttpResponse(html, status=status)


def _render_environment(request, env, status: int = 200) -> HttpResponse:
    context = _page_context(request, env)
    for build in PANELS.values():
        context.update(build(env))
    return render(request, "dashboard/environment.html", context, status=status)


def _act(request, env, panel: str, action) -> HttpResponse:
    """Run `action` (a service call) for a deployer; answer with the changed panel
    (htmx), or the page: redirected to after a success, with the refusal and its
    status after a refusal (plain form)."""
    status = 200
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
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


@login_required
@require_GET
@vary_on_headers("HX-Request")
def diff_page(request, application, environment):
    """Any two snapshots of the environment, coloured, per file."""
    env = _environment(request, application, environment)
    context = {**_page_context(request, env), **selectors.snapshots_panel(env)}
    to, against = request.GET.get("to"), request.GET.get("from")
    status = 200
    if to:
        try:
            snapshot = snapshot_get(environment=env,
                                    number=_number(to, "to", "pick a snapshot number."))
            context["diff"] = snapshot_diff(snapshot=snapshot, against=_number(
                against, "from", "pick a snapshot number.") if against else None)
        except ApplicationError as error:
            context["error"], status = error.message, error.status
    return render(request, _partial(request, "dashboard/diff.html", "result"), context,
                  status=status)


def _descriptor_from(request) -> tuple[dict, str]:
    """The descriptor pasted or uploaded, parsed with the bounded YAML loader, and
    its text."""
    upload = request.FILES.get("file")
    if upload is not None:
        if upload.size > MAX_DESCRIPTOR_BYTES:
            raise ValidationFailed(f"{upload.name}: larger than {MAX_DESCRIPTOR_BYTES} bytes.",
                                   code="too_large")
        try:
            text, name = upload.read().decode("utf-8"), upload.name
        except UnicodeDecodeError:
            raise ValidationFailed(f"{upload.name}: not UTF-8 text.") from None
    else:
        text, name = request.POST.get("descriptor", ""), "descriptor"
    if not text.strip():
        raise ValidationFailed("Paste a descriptor or choose a file.", code="descriptor_missing")
    if len(text.encode()) > MAX_DESCRIPTOR_BYTES:
        raise ValidationFailed(f"{name}: larger than {MAX_DESCRIPTOR_BYTES} bytes.",
                               code="too_large")
    descriptor, problems = load_yaml(text, limits=settings.BELLWETHER_LIMITS, file=name)
    if problems:
        raise ValidationFailed(str(problems[0]), code="descriptor_invalid",
                               details=[p.as_dict() for p in problems])
    descriptor_check(descriptor)
    return descriptor, text


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
        return render(request, "dashboard/descriptor.html", context)
    status = 200
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        descriptor, text = _descriptor_from(request)
        _check_target(descriptor, env)
        context["text"] = text
        if request.POST.get("step") == "publish":
            publication, created = descriptor_submit(environment=env, descriptor=descriptor,
                                                     actor=request.user)
            publication.refresh_from_db()
            messages.add_message(request, *_publication_message(publication, created))
            return redirect(context["env_url"])
        context["preview"] = descriptor_dry_run(env, descriptor)
    except ApplicationError as error:
        context["error"], status = error, error.status
        context["text"] = request.POST.get("descriptor", "")
    return render(request, _partial(request, "dashboard/descriptor.html", "preview"), context,
                  status=status)


def _publication_message(publication: Publication, created: bool) -> tuple[int, str]:
    if publication.state == Publication.State.RENDERING:
        return messages.INFO, "Queued for rendering; the snapshot list updates when it is ready."
    number = publication.snapshot.number
    if publication.state == Publication.State.INVALID:
        return messages.ERROR, (f"#{number} is invalid and was not activated; its report "
                                "is in the admin's snapshots and the API.")
    if publication.state == Publication.State.SUPERSEDED:
        return messages.WARNING, f"A later request finished first as #{number}."
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

    def push():
        number = request.POST.get("snapshot") or (
            str(env.active_snapshot.number) if env.active_snapshot else "")
        snapshot = snapshot_get(environment=env, number=_number(
            number, "snapshot", "nothing to deploy yet: publish a snapshot first."))
        agent = request.POST.get("agent")
        agent_ids = None if agent is None else [
            _number(agent, "agent", "not an agent id.", maximum=2**63 - 1)]
        deployments = snapshot_deploy(snapshot=snapshot, actor=request.user,
                                      agent_ids=agent_ids)
        return f"Pushed #{snapshot.number} to {len(deployments)} agent(s)."

    return _act(request, env, "agents", push)


@login_required
@require_http_methods(["GET", "POST"])
def snapshot_rollback_page(request, application, environment, number):
    """Roll back to a snapshot: a confirmation page, then a new, higher snapshot."""
    env = _environment(request, application, environment)
    try:
        snapshot = snapshot_get(environment=env, number=number)
    except ApplicationError as error:
        raise Http404(error.message) from None
    context = {**_page_context(request, env), "snapshot": snapshot}
    if request.method == "GET":
        return render(request, "dashboard/rollback.html", context)

    def roll_back():
        publication = snapshot_rollback(snapshot=snapshot, actor=request.user)
        publication.refresh_from_db()
        if publication.state == Publication.State.READY:
            return f"Rolled back to #{snapshot.number} as #{publication.snapshot.number}."
        return _publication_message(publication, True)[1]

    return _act(request, env, "snapshots", roll_back)


@login_required
@require_http_methods(["GET", "POST"])
def rollout_new(request, application, environment):
    """Start a staged rollout: canaries by agent, then waves by percent."""
    env = _environment(request, application, environment)
    context = {**_page_context(request, env), **selectors.snapshots_panel(env),
               "agents": selectors.canary_choices(env)}
    if request.method == "GET":
        return render(request, "dashboard/rollout_new.html", context)
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        number = _number(request.POST.get("snapshot"), "snapshot", "pick a snapshot to roll out.")
        canaries = [_number(c, "canary", "not an agent id.", maximum=2**63 - 1)
                    for c in request.POST.getlist("canary")]
        waves = _waves(request.POST.get("waves", "100"), request.POST.get("gate", "manual"))
        rollout = rollout_create(
            environment=env, snapshot=snapshot_get(environment=env, number=number),
            canary_agents=canaries, waves=waves, actor=request.user)
    except ApplicationError as error:
        context["error"] = error
        return render(request, "dashboard/rollout_new.html", context, status=error.status)
    messages.success(request, f"Rollout {rollout.pk} of #{rollout.snapshot.number} started: "
                              "the canaries have it now.")
    return redirect(context["env_url"])


def _waves(text: str, gate: str) -> list[dict]:
    """"25, 100" -> two waves by percent, each with `gate`."""
    if gate not in Rollout.Gate.values:
        raise ValidationFailed(f"gate: one of {', '.join(Rollout.Gate.values)}.")
    parts = [p.strip().rstrip("%") for p in text.split(",") if p.strip()]
    if not parts:
        raise ValidationFailed("waves: percentages from 1 to 100, separated by commas.")
    return [{"percent": _number(p, "waves", "percentages from 1 to 100, separated by commas.",
                                maximum=100), "gate": gate, "bake_s": 0} for p in parts]


def _rollout_action(request, application, environment, rollout_id, service, verb):
    env = _environment(request, application, environment)
    rollout = selectors.rollout_in(env, rollout_id)
    if rollout is None:
        raise Http404("Rollout not found.")
    version = request.POST.get("expected_version", "")

    def act():
        service(rollout=rollout, actor=request.user, expected_version=_number(
            version, "expected_version", "reload the page and try again."))
        return f"Rollout {rollout.pk} {verb}."

    return _act(request, env, "rollout", act)


@_signed_in_action
@require_POST
def rollout_confirm_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id, rollout_confirm,
                           "confirmed: the next wave has it")


@_signed_in_action
@require_POST
def rollout_rollback_view(request, application, environment, rollout_id):
    def rollback(**kwargs):
        return rollout_rollback(reason="rolled back from the dashboard", **kwargs)

    return _rollout_action(request, application, environment, rollout_id, rollback,
                           "rolled back")


def csrf_failure(request, reason=""):
    """CSRF_FAILURE_VIEW: an htmx request whose token went stale (signed in again in
    another tab) gets the reason in the flash and changes nothing on the page."""
    if not request.headers.get("HX-Request"):
        return django_csrf_failure(request, reason)
    messages.error(request, "This page's session has changed (signed in again "
                            "elsewhere?). Nothing was done: reload the page and try again.")
    response = HttpResponse(render_to_string("dashboard/base.html#flash", {"oob": True},
                                             request=request), status=403)
    response["HX-Reswap"] = "none"
    return response
