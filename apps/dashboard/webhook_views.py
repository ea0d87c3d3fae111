"""The dashboard's webhooks page (environment owners): register an endpoint (its
secret shown once, on the answer to that post), delete one, and watch each
endpoint's delivery log (an htmx partial refreshed every few seconds)."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from apps.core.errors import ApplicationError
from apps.dashboard import forms
from apps.dashboard.views import _environment, _page_context, _signed_in_action
from apps.environments.selectors import require_role
from apps.rollouts.strategies import default_strategy
from apps.tenancy.models import Role
from apps.webhooks import services
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint

DELIVERIES_SHOWN = 20


def _endpoints(env) -> list:
    endpoints = list(WebhookEndpoint.objects.filter(environment=env).order_by("pk"))
    for endpoint in endpoints:
        endpoint.recent = list(WebhookDelivery.objects.filter(endpoint=endpoint)
                               .order_by("-sequence")[:DELIVERIES_SHOWN])
    return endpoints


def _context(request, env, form) -> dict:
    return {**_page_context(request, env), "form": form, "endpoints": _endpoints(env),
            "default_strategy": default_strategy(env)}


@login_required
@require_http_methods(["GET", "POST"])
def webhooks_page(request, application, environment):
    env = _environment(request, application, environment)
    context = _context(request, env, forms.WebhookForm(request.POST or None))
    if not context["can_own"]:
        return render(request, "dashboard/webhooks.html", context, status=403)
    if request.htmx and request.method == "GET":
        response = render(request, "dashboard/webhooks.html#endpoints", context)
        response["Vary"] = "HX-Request"
        return response
    if request.method == "GET":
        return render(request, "dashboard/webhooks.html", context)
    form = context["form"]
    try:
        require_role(user=request.user, environment=env, required=Role.OWNER)
        if not form.is_valid():
            return render(request, "dashboard/webhooks.html", context, status=400)
        endpoint, secret = services.endpoint_create(environment=env, actor=request.user,
                                                    **form.cleaned_data)
    except ApplicationError as error:
        if not form.add_refusal(error):
            context["error"] = error
        return render(request, "dashboard/webhooks.html", context, status=error.status)
    # Shown on this answer only: never stored in the session or a message.
    return render(request, "dashboard/webhooks.html",
                  {**_context(request, env, forms.WebhookForm()), "created": endpoint,
                   "secret": secret}, status=201)


@_signed_in_action
@require_POST
def webhook_delete(request, application, environment):
    env = _environment(request, application, environment)
    form = forms.WebhookActionForm(request.POST)
    endpoint = (WebhookEndpoint.objects.filter(environment=env, pk=form.data.get("endpoint"))
                .first() if form.is_valid() else None)
    if endpoint is None:
        raise Http404("Webhook endpoint not found.")
    try:
        require_role(user=request.user, environment=env, required=Role.OWNER)
        services.endpoint_delete(endpoint=endpoint, actor=request.user)
    except ApplicationError as error:
        messages.error(request, error.message)
    else:
        messages.success(request, f"Webhook {endpoint.pk} deleted.")
    return redirect("dashboard:webhooks", env.application.name, env.name)
