"""The dashboard's history pages: promote another environment's release here (with a
preview diff), retention (stored bytes against the bounds, what keeps each snapshot,
an owner's removal with a reason), and confirming a publication held as degenerate."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST
from django.views.decorators.vary import vary_on_headers

from apps.core.errors import ApplicationError
from apps.dashboard import forms, selectors
from apps.dashboard.views import (
    _environment,
    _form_page,
    _page_context,
    _signed_in_action,
    _wants_partial,
)
from apps.environments.models import Environment
from apps.environments.selectors import require_role
from apps.releases import retention
from apps.releases.promotion import publication_confirm, snapshot_promote
from apps.releases.selectors import retention_usage
from apps.snapshots.models import Snapshot
from apps.snapshots.promotion import promoted_snapshot, promotion_preview
from apps.snapshots.selectors import snapshot_get
from apps.tenancy.models import Role

HOLDS_SHOWN = 100


def _sources(request, env) -> list[str]:
    """The environments of the same application the user sees, but this one."""
    return list(Environment.objects.visible_to(request.user)
                .filter(application=env.application).exclude(pk=env.pk)
                .order_by("name").values_list("name", flat=True))


def _source(request, env, name: str) -> Environment:
    return selectors.environment_for(request.user, env.application.name, name)


@login_required
@require_http_methods(["GET", "POST"])
@vary_on_headers("HX-Request")
def promote_page(request, application, environment):
    """Pick the environment to promote from -> the preview diff -> promote (deployers)."""
    env = _environment(request, application, environment)
    context = _page_context(request, env)
    sources = _sources(request, env)
    data = request.POST if request.method == "POST" else (request.GET or None)
    form = context["form"] = forms.PromoteForm(data, sources=sources)
    status = 200
    try:
        if data is not None and form.is_valid():
            promoted = promoted_snapshot(source=_source(request, env, form.cleaned_data["source"]),
                                         target=env, expected_number=form.cleaned_data["number"])
            if request.method == "POST":
                require_role(user=request.user, environment=env, required=Role.DEPLOYER)
                publication = snapshot_promote(
                    source=promoted.environment, target=env, actor=request.user,
                    expected_number=promoted.number, confirmed=form.cleaned_data["confirm"])
                messages.success(request, f"Promoted {promoted.environment.full_name} "
                                          f"#{promoted.number}.")
                return redirect(reverse("dashboard:publication",
                                        args=[application, environment, publication.pk]))
            context["preview"] = promotion_preview(environment=env, promoted=promoted)
        elif data is not None:
            status = 400
    except ApplicationError as error:
        status = error.status
        if not form.add_refusal(error):
            context["error"] = error
    return _form_page(request, "dashboard/promote.html", "preview", context, status)


def _retention_context(request, env) -> dict:
    stored = list(Snapshot.objects.filter(environment=env).with_stored_bytes()
                  .order_by("number").only("pk", "number", "label")[:HOLDS_SHOWN])
    with transaction.atomic():  # one consistent read; removal itself locks
        holds = retention.snapshot_holds(env, [s.pk for s in stored])
    return {**_page_context(request, env), "usage": retention_usage(env),
            "rows": [{"snapshot": s, "holds": [retention.HOLDS[c] for c in holds[s.pk]]}
                     for s in stored]}


@login_required
@require_http_methods(["GET"])
@vary_on_headers("HX-Request")
def retention_page(request, application, environment):
    env = _environment(request, application, environment)
    template = "dashboard/retention.html"
    return render(request, f"{template}#rows" if _wants_partial(request) else template,
                  _retention_context(request, env))


@_signed_in_action
@require_POST
def snapshot_remove_view(request, application, environment, number):
    """An owner removes one snapshot, with a reason; refusals name what keeps it."""
    env = _environment(request, application, environment)
    form = forms.SnapshotRemoveForm(request.POST)
    status = 200
    try:
        require_role(user=request.user, environment=env, required=Role.OWNER)
        if not form.is_valid():
            status = 400
            messages.error(request, "A reason is required to remove a snapshot.")
        else:
            retention.snapshot_remove(snapshot=snapshot_get(environment=env, number=number),
                                      actor=request.user, reason=form.cleaned_data["reason"])
            messages.success(request, f"Removed #{number}.")
    except ApplicationError as error:
        status = error.status
        messages.error(request, error.message)
    context = _retention_context(request, env)
    if _wants_partial(request):
        return render(request, "dashboard/retention.html#rows", context, status=status)
    if status != 200:
        return render(request, "dashboard/retention.html", context, status=status)
    return redirect(reverse("dashboard:retention", args=[application, environment]))


@_signed_in_action
@require_POST
def publication_confirm_view(request, application, environment, publication_id):
    """Confirm a publication held for its degenerate render (the checkbox is required)."""
    env = _environment(request, application, environment)
    publication = selectors.publication_in(env, publication_id)
    if publication is None:
        raise Http404("Publication not found.")
    try:
        require_role(user=request.user, environment=env, required=Role.DEPLOYER)
        if request.POST.get("confirm") != "on":
            messages.error(request, "Tick the box to confirm you checked the files.")
        else:
            publication_confirm(publication=publication, actor=request.user)
            messages.success(request, f"Confirmed #{publication.snapshot.number}.")
    except ApplicationError as error:
        messages.error(request, error.message)
    return redirect(reverse("dashboard:publication",
                            args=[application, environment, publication_id]))
