"""The dashboard's rollout pages and actions: start a rollout (from a publish in a
staged environment, with its new snapshot chosen), confirm, roll back, release pins."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from apps.core.errors import ApplicationError
from apps.dashboard import forms, rollout_reads, selectors
from apps.dashboard.views import (
    _act,
    _environment,
    _page_context,
    _partial,
    _signed_in_action,
)
from apps.environments.selectors import require_role
from apps.rollouts import pausing
from apps.rollouts import rules as rollout_rules
from apps.rollouts.services import (
    rollout_confirm,
    rollout_create,
    rollout_pins_release,
    rollout_rollback,
)
from apps.rollouts.strategies import rollout_options_for, strategies_for
from apps.snapshots.selectors import snapshot_get
from apps.tenancy.models import Role


@login_required
@require_http_methods(["GET", "POST"])
def rollout_new(request, application, environment):
    """Start a staged rollout: a named strategy, and/or canaries by agent, then waves
    by percent (overriding the strategy's)."""
    env = _environment(request, application, environment)
    choices = {"snapshots": selectors.rollout_snapshots(env),
               "agents": selectors.canary_choices(env),
               "strategies": list(strategies_for(env))}
    context = _page_context(request, env)
    context["nothing_to_roll_out"] = not choices["snapshots"]
    if request.method == "GET":
        # ?snapshot=N: the snapshot a publish just stored (chosen when offered).
        context["form"] = forms.RolloutForm(**choices, chosen=request.GET.get("snapshot"))
        return render(request, "dashboard/rollout_new.html", context)
    form = context["form"] = forms.RolloutForm(request.POST, **choices)
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        if not form.is_valid():
            return render(request, "dashboard/rollout_new.html", context, status=400)
        rollout = _start(env, form.cleaned_data, request.user)
    except ApplicationError as error:
        if not form.add_refusal(error):
            context["error"] = error
        return render(request, "dashboard/rollout_new.html", context, status=error.status)
    messages.success(request, f"Rollout {rollout.pk} of #{rollout.snapshot.number} started: "
                              "the canaries have it now.")
    return redirect(context["env_url"])


def _start(env, data: dict, actor):
    """rollout_create with what the valid rollout form says: canaries by agent, by
    labels and by percent of the enabled agents together; the waves and their
    settings from the strategy chosen, else (none chosen) the form's own."""
    canaries = list(data["canary"])
    if data["canary_percent"]:
        canaries += selectors.canaries_by_percent(env, data["canary_percent"])
    given = {"canary_agents": canaries or None, "canary_labels": data["canary_labels"] or None}
    if not data["strategy"]:
        given |= {"waves": data["plan"], "bake_s": data["bake_s"],
                  "failure_threshold": data["failure_threshold"],
                  "wave_timeout_s": data["wave_timeout_s"]}
    strategy, options = rollout_options_for(env, data["strategy"] or None, given)
    return rollout_create(
        environment=env, snapshot=snapshot_get(environment=env, number=data["snapshot"]),
        actor=actor, strategy=strategy, confirmed=data["confirm"], **options)


def _rollout_action(request, application, environment, rollout_id, service, verb):
    env = _environment(request, application, environment)
    rollout = selectors.rollout_in(env, rollout_id)
    if rollout is None:
        raise Http404("Rollout not found.")
    form = forms.RolloutActionForm(request.POST)

    def act():
        done = service(rollout=rollout, actor=request.user,
                       expected_version=form.cleaned_data["expected_version"])
        return f"Rollout {rollout.pk} {verb(done) if callable(verb) else verb}."

    return _act(request, env, "rollout", act, form)


@_signed_in_action
@require_POST
def rollout_confirm_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id, rollout_confirm,
                           _confirmed)


def _confirmed(rollout) -> str:
    if rollout.state == "completed":
        return f"confirmed and completed: #{rollout.snapshot.number} is active"
    return f"confirmed: {rollout_rules.wave_name(rollout.current_wave)} has it now"


@_signed_in_action
@require_POST
def rollout_rollback_view(request, application, environment, rollout_id):
    def rollback(**kwargs):
        return rollout_rollback(reason="rolled back from the dashboard", **kwargs)

    return _rollout_action(request, application, environment, rollout_id, rollback,
                           "rolled back")


@_signed_in_action
@require_POST
def rollout_release_pins_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id,
                           rollout_pins_release, "released its remaining pins")


@_signed_in_action
@require_POST
def rollout_pause_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id,
                           pausing.rollout_pause, "paused: nothing advances until it resumes")


@_signed_in_action
@require_POST
def rollout_resume_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id,
                           pausing.rollout_resume, "resumed: its wave's clock starts again")


@login_required
@require_GET
@vary_on_headers("HX-Request")
def rollout_history(request, application, environment):
    """The environment's rollouts, newest first, each with its timeline."""
    env = _environment(request, application, environment)
    context = {**_page_context(request, env),
               **rollout_reads.rollout_history(env, request.GET.get("page"))}
    return render(request, _partial(request, "dashboard/rollout_history.html", "list"),
                  context)
