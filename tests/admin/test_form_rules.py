"""The admin's forms check names, labels, paths and numbers with the API's rules:
every registered ModelAdmin (and inline) reads integers as ASCII digits and every
name/label/path model field carries the name rule."""

import pytest
from django.contrib import admin
from django.test import RequestFactory

from apps.core.validators import WholeNumberFormField, validate_name_text
from apps.fleet.models import EnrollmentToken
from apps.tenancy.models import ApiToken

NAME_FIELDS = {("fleet.EnrollmentToken", "name"), ("fleet.Agent", "name"),
               ("tenancy.Tenant", "name"), ("tenancy.ApiToken", "name"),
               ("environments.Template", "path"), ("environments.FallbackFile", "path")}
BAD_NAMES = ["a\u202eb", "a\u200bb", "a\x01b", "a\ue000b", "a\u2028b", "a\u115fb", "a\u00a0b",
             "a\u3000b", "a\ufe0fb"]
BAD_NUMBERS = ["1.0", "\u0663", "+1", "\uff11", "1e1", "-1"]


def _admins():
    for model, model_admin in admin.site._registry.items():
        yield model, model_admin
        for inline in model_admin.inlines:
            yield inline.model, inline(model, admin.site)


@pytest.mark.parametrize(("model", "model_admin"), list(_admins()),
                         ids=lambda x: getattr(x, "__name__", type(x).__name__))
def test_every_admin_form_reads_integers_as_ascii_digits(model, model_admin, superuser):
    request = RequestFactory().get("/admin/")
    request.user = superuser
    if hasattr(model_admin, "get_formset"):
        form = model_admin.get_formset(request).form
    else:
        form = model_admin.get_form(request)
    for name, field in form.base_fields.items():
        if isinstance(field, __import__("django").forms.IntegerField):
            assert isinstance(field, WholeNumberFormField), (model, name)


@pytest.mark.parametrize(("label", "field"), sorted(NAME_FIELDS))
def test_every_name_label_and_path_field_carries_the_name_rule(label, field):
    from django.apps import apps

    model = apps.get_model(label)
    assert validate_name_text in model._meta.get_field(field).validators


@pytest.mark.parametrize("name", BAD_NAMES)
def test_the_enrollment_token_form_refuses_an_invisible_name(login, tenant_owner, environment,
                                                             name):
    response = login(tenant_owner).post("/admin/fleet/enrollmenttoken/add/", {
        "environment": environment.pk, "name": name, "max_uses": "1",
        "expires_in_hours": "24"})

    assert response.status_code == 200
    assert "name" in response.context["adminform"].form.errors
    assert not EnrollmentToken.objects.exists()


@pytest.mark.parametrize("number", BAD_NUMBERS)
def test_the_enrollment_token_form_refuses_a_number_not_in_ascii_digits(
        login, tenant_owner, environment, number):
    response = login(tenant_owner).post("/admin/fleet/enrollmenttoken/add/", {
        "environment": environment.pk, "name": "web", "max_uses": number,
        "expires_in_hours": number})

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert "max_uses" in errors and "expires_in_hours" in errors
    assert not EnrollmentToken.objects.exists()


def test_the_enrollment_token_form_saves_a_plain_name(login, tenant_owner, environment):
    # Plain spaces at either end are trimmed by the form, as DRF trims them.
    response = login(tenant_owner).post("/admin/fleet/enrollmenttoken/add/", {
        "environment": environment.pk, "name": " web 1 ", "max_uses": "3",
        "expires_in_hours": "24"})

    assert response.status_code == 302
    assert EnrollmentToken.objects.get().name == "web 1"


@pytest.mark.parametrize("name", BAD_NAMES)
def test_an_api_token_name_is_refused_in_the_admin(login, superuser, name):
    response = login(superuser).post("/admin/tenancy/apitoken/add/", {
        "user": superuser.pk, "name": name})

    assert response.status_code == 200
    assert "name" in response.context["adminform"].form.errors
    assert not ApiToken.objects.exists()
