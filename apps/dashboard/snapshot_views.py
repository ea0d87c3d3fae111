"""The dashboard's snapshot pages and actions: the snapshot list a page at a time,
compare (opening on a meaningful pair, with the effective config's change), and
publishing the pending changes."""

from django.contrib.auth.decorators import login_required
from django.shortcuts import render
from django.views.decorators.http import require_GET, require_POST
from django.views.decorators.vary import vary_on_headers

from apps.core.errors import ApplicationError
from apps.dashboard import forms, snapshot_reads
from apps.dashboard.views import (
    _act,
    _environment,
    _form_page,
    _page_context,
    _partial,
    _publication_message,
    _signed_in_action,
)
from apps.releases.services import snapshot_publish
from apps.snapshots.models import Publication
from apps.snapshots.selectors import snapshot_diff, snapshot_get


@login_required
@require_GET
@vary_on_headers("HX-Request")
def snapshot_list(request, application, environment):
    """Every snapshot of the environment, newest first, a page at a time."""
    env = _environment(request, application, environment)
    context = {**_page_context(request, env),
               **snapshot_reads.snapshots_page(env, request.GET.get("page"))}
    return render(request, _partial(request, "dashboard/snapshot_list.html", "list"), context)


def _compared(request, env, ready) -> forms.DiffForm:
    """The form of the compare page: what was asked, or with nothing asked the pair
    worth comparing (the newest against the active one, or the active one against
    the one before)."""
    data = request.GET
    if "to" not in data and "from" not in data:
        before, after = snapshot_reads.default_pair(env, ready)
        data = {"to": after or "", "from": before or ""}
    return forms.DiffForm(data, snapshots=ready)


def _compare(form: forms.DiffForm, env, context: dict) -> int:
    """Fill `context` with the diff the valid `form` asks for; the status."""
    asked = "to"  # the snapshot a "not found" is about
    try:
        snapshot = snapshot_get(environment=env, number=form.cleaned_data["to"])
        asked = "from"
        diff = context["diff"] = snapshot_diff(snapshot=snapshot,
                                               against=form.cleaned_data["from"])
        context["config"] = snapshot_reads.config_change(snapshot, diff["against"])
    except ApplicationError as error:
        if error.code != "not_found" or not form.add_refusal(error, asked):
            context["error"] = error.message
        return error.status
    return 200


@login_required
@require_GET
@vary_on_headers("HX-Request")
def diff_page(request, application, environment):
    """Any two snapshots of the environment, coloured, per file, and the change of
    the effective config between them."""
    env = _environment(request, application, environment)
    form = _compared(request, env, snapshot_reads.ready_snapshots(env))
    context = {**_page_context(request, env), "form": form}
    status = 200
    if not form.is_valid():
        status = 400
    elif form.cleaned_data["to"] is not None:
        status = _compare(form, env, context)
    return _form_page(request, "dashboard/diff.html", "result", context, status)


@_signed_in_action
@require_POST
def publish(request, application, environment):
    """Publish the pending changes: the environment's current inputs as a snapshot
    (activated or staged as its release policy says)."""
    env = _environment(request, application, environment)

    def publish_inputs():
        publication = snapshot_publish(environment=env, actor=request.user)
        publication.refresh_from_db()
        if publication.state == Publication.State.RENDERING:
            return "Publishing the pending changes: queued for rendering."
        return _publication_message(publication, True)[1]

    return _act(request, env, "pending", publish_inputs)
