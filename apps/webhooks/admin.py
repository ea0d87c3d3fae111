"""Webhooks in the admin (environment owners): register an endpoint (its secret is
shown once), change it, rotate its secret or delete it through the services; the
delivery log is read-only."""

from django import forms
from django.contrib import admin, messages

from apps.core.admin import OwnedAdminMixin, ReadOnlyAdminMixin
from apps.core.errors import ApplicationError
from apps.core.events import DOMAIN_EVENTS
from apps.environments.models import Environment
from apps.webhooks import services
from apps.webhooks.models import WebhookDelivery, WebhookEndpoint


class EndpointForm(forms.ModelForm):
    url = forms.CharField(max_length=2000, strip=False)  # refused with whitespace, not trimmed
    events = forms.MultipleChoiceField(choices=[(e, e) for e in DOMAIN_EVENTS],
                                       widget=forms.CheckboxSelectMultiple)

    class Meta:
        model = WebhookEndpoint
        fields = ["environment", "url", "events", "description", "enabled"]

    def clean_url(self):
        """The one check of the URL a save makes, its host resolved once: the save
        tells the service so (a second lookup could answer otherwise, after the
        form was accepted)."""
        problem = services.url_problem(self.cleaned_data["url"])
        if problem:
            raise forms.ValidationError(problem)
        return self.cleaned_data["url"]


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(OwnedAdminMixin, admin.ModelAdmin):
    form = EndpointForm
    list_display = ["pk", "environment", "url", "enabled", "next_sequence", "created_at"]
    list_select_related = ["environment__application"]
    actions = ["rotate_secret", "delete_endpoints"]

    def get_queryset(self, request):
        return WebhookEndpoint.objects.filter(
            environment__in=Environment.objects.owned_by(request.user))

    def get_readonly_fields(self, request, obj=None):
        return ["environment"] if obj else []

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "environment":
            kwargs["queryset"] = Environment.objects.owned_by(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_add_permission(self, request, *args):
        return request.user.is_active and request.user.is_staff

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        if change:
            services.endpoint_update(endpoint=obj, actor=request.user, url=data["url"],
                                     events=data["events"], enabled=data["enabled"],
                                     description=data["description"], url_checked=True)
            return
        endpoint, secret = services.endpoint_create(
            environment=data["environment"], url=data["url"], events=data["events"],
            description=data["description"], actor=request.user, url_checked=True)
        obj.pk = endpoint.pk
        self.message_user(request, f"Webhook {endpoint.pk}'s signing secret (shown only "
                                   f"once, copy it now): {secret}", messages.WARNING)

    @admin.action(description="Rotate the signing secret")
    def rotate_secret(self, request, queryset):
        for endpoint in queryset:
            _, secret = services.endpoint_update(endpoint=endpoint, actor=request.user,
                                                 rotate_secret=True)
            self.message_user(request, f"Webhook {endpoint.pk}'s new secret (shown only "
                                       f"once): {secret}", messages.WARNING)

    @admin.action(description="Delete the selected endpoints")
    def delete_endpoints(self, request, queryset):
        for endpoint in queryset:
            try:
                services.endpoint_delete(endpoint=endpoint, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.ERROR)
        self.message_user(request, "Deleted.", messages.SUCCESS)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["endpoint", "sequence", "event", "state", "attempts", "last_status",
                    "created_at", "delivered_at"]
    list_filter = ["state", "event"]
    list_select_related = ["endpoint"]
    fields = ["endpoint", "sequence", "event", "state", "attempts", "next_attempt_at",
              "last_status", "last_error", "log", "body", "created_at", "delivered_at"]
    readonly_fields = fields

    def get_queryset(self, request):
        return WebhookDelivery.objects.filter(
            endpoint__environment__in=Environment.objects.owned_by(request.user))
