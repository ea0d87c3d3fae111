"""The dashboard's rollout pages and actions: start a rollout (from a publish in a
staged environment, with its new snapshot chosen), confirm, roll back, release pins."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.core.errors import ApplicationError
from apps.dashboard import forms, selectors
from apps.dashboard.views import _act, _environment, _page_context, _signed_in_action
from apps.environments.selectors import require_role
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
    if request.method == "GET":
        # ?snapshot=N: the snapshot a publish just stored (chosen when offered).
        context["form"] = forms.RolloutForm(**choices, chosen=request.GET.get("snapshot"))
        return render(request, "dashboard/rollout_new.html", context)
    form = context["form"] = forms.RolloutForm(request.POST, **choices)
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        if not form.is_valid():
            return render(request, "dashboard/rollout_new.html", context, status=400)
        data = form.cleaned_data
        strategy, options = rollout_options_for(
            env, data["strategy"] or None,
            {"canary_agents": data["canary"] or None, "waves": data["plan"]})
        rollout = rollout_create(
            environment=env, snapshot=snapshot_get(environment=env, number=data["snapshot"]),
            actor=request.user, strategy=strategy, **options)
    except ApplicationError as error:
        if not form.add_refusal(error):
            context["error"] = error
        return render(request, "dashboard/rollout_new.html", context, status=error.status)
    messages.success(request, f"Rollout {rollout.pk} of #{rollout.snapshot.number} started: "
                              "the canaries have it now.")
    return redirect(context["env_url"])


def _rollout_action(request, application, environment, rollout_id, service, verb):
    env = _environment(request, application, environment)
    rollout = selectors.rollout_in(env, rollout_id)
    if rollout is None:
        raise Http404("Rollout not found.")
    form = forms.RolloutActionForm(request.POST)

    def act():
        service(rollout=rollout, actor=request.user,
                expected_version=form.cleaned_data["expected_version"])
        return f"Rollout {rollout.pk} {verb}."

    return _act(request, env, "rollout", act, form)


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


@_signed_in_action
@require_POST
def rollout_release_pins_view(request, application, environment, rollout_id):
    return _rollout_action(request, application, environment, rollout_id,
                           rollout_pins_release, "released its remaining pins")
