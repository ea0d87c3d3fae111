"""The app teams' dashboard: one view per page, a named partial for htmx requests,
every action a POST that calls a service (the same ones the API calls).

An htmx action answers with the panel it changed plus the flash messages swapped
out of band, with the service's status code (htmx is configured to swap 4xx too);
a plain form post is redirected back to the page with the message.
"""

import logging

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from apps.core.errors import ApplicationError, ValidationFailed
from apps.dashboard import selectors
from apps.environments.selectors import require_role
from apps.environments.services import descriptor_check, descriptor_submit
from apps.fleet.models import Agent
from apps.fleet.services import snapshot_deploy
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_confirm, rollout_create, rollout_rollback
from apps.snapshots.models import Publication
from apps.snapshots.selectors import descriptor_dry_run, snapshot_diff, snapshot_get
from apps.snapshots.services import snapshot_rollback
from apps.snapshots.yamlconfig import load_yaml
from apps.tenancy.models import Role

logger = logging.getLogger(__name__)

PANELS = {
    "agents": selectors.agents_panel,
    "snapshots": selectors.snapshots_panel,
    "pending": selectors.pending_panel,
    "rollout": selectors.rollout_panel,
}
MAX_DESCRIPTOR_BYTES = 256 * 1024


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


def _panel_response(request, env, panel: str, status: int = 200) -> HttpResponse:
    """The panel's partial, with the flash messages swapped in out of band."""
    context = {**_page_context(request, env), **PANELS[panel](env)}
    html = render_to_string(f"dashboard/environment.html#{panel}", context, request=request)
    html += render_to_string("dashboard/base.html#flash", {"oob": True}, request=request)
    return HttpResponse(html, status=status)


def _act(request, env, panel: str, action) -> HttpResponse:
    """Run `action` (a service call) for a deployer; answer with the changed panel
    (htmx) or a redirect to the page (plain form)."""
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
    if request.htmx:
        return _panel_response(request, env, panel, status)
    if status == 403:
        return HttpResponse(status=403, content=format_html(
            "<p>{}</p>", "You may not do this here."))
    return redirect(_page_context(request, env)["env_url"])


@login_required
@require_GET
@vary_on_headers("HX-Request")
def overview(request):
    context = {"rows": selectors.overview_for(request.user)}
    template = "dashboard/overview.html#environments" if request.htmx else "dashboard/overview.html"
    return render(request, template, context)


@login_required
@require_GET
@vary_on_headers("HX-Request")
def environment_page(request, application, environment):
    env = _environment(request, application, environment)
    panel = request.GET.get("panel")
    if request.htmx and panel in PANELS:
        return render(request, f"dashboard/environment.html#{panel}",
                      {**_page_context(request, env), **PANELS[panel](env)})
    context = _page_context(request, env)
    for build in PANELS.values():
        context.update(build(env))
    return render(request, "dashboard/environment.html", context)


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
            if not to.isdigit() or (against and not against.isdigit()):
                raise ValidationFailed("Pick two snapshot numbers.")
            snapshot = snapshot_get(environment=env, number=int(to))
            context["diff"] = snapshot_diff(snapshot=snapshot,
                                            against=int(against) if against else None)
        except ApplicationError as error:
            context["error"], status = error.message, error.status
    template = "dashboard/diff.html#result" if request.htmx else "dashboard/diff.html"
    return render(request, template, context, status=status)


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
    template = "dashboard/descriptor.html#preview" if request.htmx else "dashboard/descriptor.html"
    return render(request, template, context, status=status)


def _publication_message(publication: Publication, created: bool) -> tuple[int, str]:
    if publication.state == Publication.State.RENDERING:
        return messages.INFO, "Queued for rendering; the snapshot list updates when it is ready."
    number = publication.snapshot.number
    if publication.state == Publication.State.INVALID:
        return messages.ERROR, f"#{number} is invalid; open it to read its report."
    if publication.state == Publication.State.SUPERSEDED:
        return messages.WARNING, f"A later request finished first as #{number}."
    if not created:
        return messages.INFO, f"This descriptor was already published as #{number}."
    return messages.SUCCESS, f"Published #{number}."


@login_required
@require_POST
def deploy(request, application, environment):
    """Deploy now: push a snapshot (default: the active one) to one agent or all."""
    env = _environment(request, application, environment)

    def push():
        number = request.POST.get("snapshot") or (
            str(env.active_snapshot.number) if env.active_snapshot else "")
        if not number.isdigit():
            raise ValidationFailed("Nothing to deploy yet: publish a snapshot first.")
        snapshot = snapshot_get(environment=env, number=int(number))
        agent = request.POST.get("agent")
        if agent is not None and not agent.isdigit():
            raise ValidationFailed("agent: not an agent id.")
        deployments = snapshot_deploy(snapshot=snapshot, actor=request.user,
                                      agent_ids=[int(agent)] if agent else None)
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
               "agents": Agent.objects.filter(environment=env, enabled=True).order_by("name")}
    if request.method == "GET":
        return render(request, "dashboard/rollout_new.html", context)
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        number, canaries = request.POST.get("snapshot", ""), request.POST.getlist("canary")
        if not number.isdigit():
            raise ValidationFailed("snapshot: pick a snapshot to roll out.")
        if not all(c.isdigit() for c in canaries):
            raise ValidationFailed("canary: not an agent id.")
        waves = _waves(request.POST.get("waves", "100"), request.POST.get("gate", "manual"))
        rollout = rollout_create(
            environment=env, snapshot=snapshot_get(environment=env, number=int(number)),
            canary_agents=[int(c) for c in canaries], waves=waves, actor=request.user)
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
    if not parts or not all(p.isdigit() and 1 <= int(p) <= 100 for p in parts):
        raise ValidationFailed("waves: percentages from 1 to 100, separated by commas.")
    return [{"percent": int(p), "gate": gate, "bake_s": 0} for p in parts]


def _rollout_action(request, application, environment, rollout_id, service, verb):
    env = _environment(request, application, environment)
    rollout = Rollout.objects.filter(pk=rollout_id, environment=env).first()
    if rollout is None:
        raise Http404("Rollout not found.")
    version = request.POST.get("expected_version", "")

    def act():
        if not version.isdigit():
            raise ValidationFailed("expected_version: reload the page and try again.")
        service(rollout=rollout, expected_version=int(version), actor=request.user)
        return f"Rollout {rollout.pk} {verb}."

    return _act(request, env, "rollout", act)


@login_required
@require_POST
def rollout_confirm_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id, rollout_confirm,
                           "confirmed: the next wave has it")


@login_required
@require_POST
def rollout_rollback_view(request, application, environment, rollout_id):
    def rollback(**kwargs):
        return rollout_rollback(reason="rolled back from the dashboard", **kwargs)

    return _rollout_action(request, application, environment, rollout_id, rollback,
                           "rolled back")
