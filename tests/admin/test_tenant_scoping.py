"""Every page of the admin, as a tenant owner of tenant A sees it, names nothing of
tenant B: each registered ModelAdmin's changelist (with its filters and a search),
add page, change page and the choice lists in its forms, the autocomplete view, and
its actions when they are posted with tenant B's ids.

Tenant B's objects are all named with "zebra", so one look at a page's text finds a
leak, whatever the field, filter or inline that shows it.
"""

import pytest
from django.contrib import admin
from django.forms import ModelChoiceField
from django.test import RequestFactory
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.fleet.models import EnrollmentToken
from apps.rollouts.models import Rollout
from apps.tenancy.models import Role
from tests import factories
from tests.admin.support import environment_form
from tests.factories import enrolled_agents, staged_environment, start_rollout

pytestmark = pytest.mark.django_db

LEAK = "zebra"


@pytest.fixture
def tenant_b(superuser):
    """Tenant B with an owner, an application, an environment with snapshots, an
    agent, an enrollment token, an API token and a running rollout, all "zebra"."""
    zebra = factories.tenant(actor=superuser, name="Zebra Corp", slug="zebra-corp")
    owner = factories.member(zebra, Role.OWNER, username="zebra-owner", is_staff=True,
                             actor=superuser)
    application = factories.application(zebra, actor=superuser, name="zebra-app")
    env, _, second = staged_environment(application, "zebra-env", superuser)
    node, = enrolled_agents(env, 1, prefix="zebra-agent")
    factories.enrollment_token(env, actor=superuser, name="zebra-token")
    factories.api_token(owner, name="zebra-apitoken")
    rollout = start_rollout(env, second, [node])
    return {"tenant": zebra, "owner": owner, "application": application,
            "environment": env, "agent": node.agent, "rollout": rollout}


@pytest.fixture
def world_a(environment, superuser, tenant_owner):
    """Tenant A (shop-team): shop/prod published with an agent, an enrollment token, an
    API token of its owner, and a rollout."""
    env, _, second = staged_environment(environment.application, "staging", superuser)
    node, = enrolled_agents(env, 1, prefix="shop-agent")
    factories.enrollment_token(environment, actor=superuser, name="shop-token")
    factories.api_token(tenant_owner, name="shop-apitoken")
    start_rollout(env, second, [node])
    return tenant_owner


def _admins():
    return sorted(admin.site._registry.items(), key=lambda item: item[0]._meta.label)


def _url(model, page: str, *args) -> str:
    return reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_{page}", args=args)


def _request_as(user):
    request = RequestFactory().get("/admin/")
    request.user = user
    return request


def _no_leak(response, where: str) -> None:
    assert response.status_code in (200, 302, 403, 404), (where, response.status_code)
    text = response.content.decode().lower()
    assert LEAK not in text, f"{where} names tenant B: ...{text[text.find(LEAK) - 200:][:400]}"


def _choice_fields(response):
    form = response.context.get("adminform") if response.context else None
    if form is None:
        return []
    return [(name, field) for name, field in form.form.fields.items()
            if isinstance(field, ModelChoiceField)]


@pytest.mark.slow  # every admin page of every model
def test_a_tenant_owner_sees_nothing_of_another_tenant_on_any_admin_page(
        tenant_b, world_a, login, subtests):
    client = login(world_a)
    for model, model_admin in _admins():
        with subtests.test(model._meta.label):
            _pages_leak_nothing(client, model, model_admin, _request_as(world_a))


def _pages_leak_nothing(client, model, model_admin, request):
    """The changelist (searched, filtered), add and change pages of `model` and the
    choices of their forms, as `request`'s user sees them, name nothing of tenant B."""
    _no_leak(client.get(_url(model, "changelist")), "changelist")
    _no_leak(client.get(_url(model, "changelist"), {"q": LEAK[:4]}), "search")
    for spec in model_admin.get_list_filter(request):
        name = spec[0] if isinstance(spec, tuple) else spec
        if isinstance(name, str):
            _no_leak(client.get(_url(model, "changelist"), {f"{name}__isnull": "False"}),
                     f"filter {name}")
    pages = [_url(model, "add")]
    first = model_admin.get_queryset(request).order_by("pk").first()
    if first is not None:
        pages.append(_url(model, "change", first.pk))
    for page in pages:
        response = client.get(page)
        _no_leak(response, page)
        for name, field in _choice_fields(response):
            leaked = [str(o) for o in field.queryset if LEAK in str(o).lower()]
            assert not leaked, (page, name, leaked)


def test_autocomplete_answers_nothing_of_another_tenant(tenant_b, world_a, login, subtests):
    client = login(world_a)
    for model, _ in _admins():
        for field in model._meta.get_fields():
            if not (field.is_relation and field.concrete):
                continue
            with subtests.test(f"{model._meta.label}.{field.name}"):
                response = client.get(reverse("admin:autocomplete"), {
                    "app_label": model._meta.app_label, "model_name": model._meta.model_name,
                    "field_name": field.name, "term": LEAK[:4]})
                _no_leak(response, f"autocomplete {field.name}")


def test_actions_posted_with_another_tenants_ids_change_nothing(tenant_b, world_a, login,
                                                                subtests):
    client = login(world_a)
    before = AuditEvent.objects.count()
    for model, model_admin in _admins():
        theirs = model_admin.get_queryset(_request_as(tenant_b["owner"]))
        if model._meta.label == "tenancy.ApiToken":
            theirs = theirs.model.objects.filter(user=tenant_b["owner"])
        ids = [str(pk) for pk in theirs.values_list("pk", flat=True)]
        for action in model_admin.get_actions(_request_as(world_a)):
            with subtests.test(f"{model._meta.label} {action}"):
                response = client.post(_url(model, "changelist"),
                                       {"action": action, "_selected_action": ids, "index": 0})
                # 403: the admin refuses the whole page (django-axes' needs model
                # permissions).
                assert response.status_code in (200, 302, 403), response.status_code
                assert AuditEvent.objects.count() == before


def test_an_environment_owner_form_lists_only_the_tenants_members(tenant_b, world_a, login,
                                                                  environment):
    client = login(world_a)

    response = client.get(_url(Environment, "change", environment.pk))

    owners = response.context["adminform"].form.fields["owners"].queryset
    assert "zebra-owner" not in {u.username for u in owners}
    assert {"staff-owner"} <= {u.username for u in owners}


def test_posting_another_tenants_user_as_an_owner_is_refused(tenant_b, world_a, login,
                                                             environment):
    client = login(world_a)

    response = client.post(_url(Environment, "change", environment.pk), environment_form(
        environment, owners=[str(tenant_b["owner"].pk)]))

    assert response.status_code == 200  # the form again, with its error
    assert "owners" in response.context["adminform"].form.errors
    assert not environment.owners.filter(pk=tenant_b["owner"].pk).exists()


def test_posting_another_tenants_environment_for_an_enrollment_token_is_refused(
        tenant_b, world_a, login):
    client = login(world_a)

    response = client.post(_url(EnrollmentToken, "add"), {
        "environment": str(tenant_b["environment"].pk), "name": "stolen", "max_uses": "1",
        "expires_in_hours": "1"})

    assert response.status_code == 200
    assert "environment" in response.context["adminform"].form.errors
    assert not EnrollmentToken.objects.filter(name="stolen").exists()


def test_the_index_pages_name_nothing_of_another_tenant(tenant_b, world_a, login):
    client = login(world_a)
    _no_leak(client.get(reverse("admin:index")), "index")
    for app_label in {model._meta.app_label for model, _ in _admins()}:
        _no_leak(client.get(reverse("admin:app_list", args=[app_label])), app_label)


def test_another_tenants_change_and_history_pages_send_the_owner_away(tenant_b, world_a,
                                                                      login):
    client = login(world_a)
    for obj in (tenant_b["tenant"], tenant_b["application"], tenant_b["environment"],
                tenant_b["agent"], tenant_b["rollout"]):
        response = client.get(_url(type(obj), "change", obj.pk))
        assert response.status_code == 302, obj
        _no_leak(client.get(response["Location"]), f"after {obj}")
        _no_leak(client.get(_url(type(obj), "history", obj.pk)), f"history of {obj}")
        _no_leak(client.get(_url(type(obj), "delete", obj.pk)), f"delete of {obj}")
    assert Rollout.objects.get(pk=tenant_b["rollout"].pk).state == "running"
