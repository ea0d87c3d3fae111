"""Admin for tenants, memberships, applications and API tokens (saves via services)."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model

from apps.core.admin import OwnedAdminMixin, OwnedInlineMixin, StrictFieldsMixin
from apps.releases.services import member_remove
from apps.tenancy import services
from apps.tenancy.models import ApiToken, Application, Membership, Tenant


class MembershipForm(forms.ModelForm):
    """Members are named by username: tenant owners may add people without being
    able to browse every user of the installation."""

    username = forms.CharField(max_length=150)

    class Meta:
        model = Membership
        fields = ["username", "role"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.initial["username"] = self.instance.user.get_username()

    def clean_username(self):
        username = self.cleaned_data["username"]
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            raise forms.ValidationError(f"No active user named {username!r}.")
        self.cleaned_data["user"] = user
        return username


class MembershipInline(OwnedInlineMixin, admin.TabularInline):
    model = Membership
    form = MembershipForm
    extra = 0


def _owned_tenants(user):
    if user.is_superuser:
        return Tenant.objects.all()
    return Tenant.objects.filter(memberships__user=user, memberships__role="owner")


@admin.register(Tenant)
class TenantAdmin(OwnedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]

    def get_queryset(self, request):
        return _owned_tenants(request.user)

    def get_readonly_fields(self, request, obj=None):
        readonly = ["slug"] if obj else []
        # Restrictions are the platform team's registry; tenant owners only read them.
        return readonly if request.user.is_superuser else [*readonly, "restrictions"]

    def save_model(self, request, obj, form, change):
        if change:
            services.tenant_update(tenant=obj, name=form.cleaned_data["name"],
                                   restrictions=form.cleaned_data.get("restrictions"),
                                   actor=request.user)
        else:
            obj.pk = services.tenant_create(name=form.cleaned_data["name"],
                                            slug=form.cleaned_data["slug"],
                                            actor=request.user).pk

    def save_formset(self, request, form, formset, change):
        tenant = Tenant.objects.get(pk=form.instance.pk)
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for member_form in formset.forms:
            data = member_form.cleaned_data
            if not data:
                continue
            existing = member_form.instance if member_form.instance.pk else None
            if existing and (data.get("DELETE") or existing.user != data["user"]):
                member_remove(membership=existing, actor=request.user)
            if not data.get("DELETE") and member_form.has_changed():
                services.membership_set(tenant=tenant, user=data["user"], role=data["role"],
                                        actor=request.user)


@admin.register(Application)
class ApplicationAdmin(OwnedAdminMixin, admin.ModelAdmin):
    list_display = ["name", "tenant", "created_at"]
    list_filter = [("tenant", admin.RelatedOnlyFieldListFilter)]
    search_fields = ["name"]

    def get_queryset(self, request):
        return Application.objects.filter(
            tenant__in=_owned_tenants(request.user)).select_related("tenant")

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "name"] if obj else []

    def save_model(self, request, obj, form, change):
        if change:
            services.application_update(application=obj,
                                        description=form.cleaned_data["description"],
                                        actor=request.user)
        else:
            obj.pk = services.application_create(
                tenant=form.cleaned_data["tenant"], name=form.cleaned_data["name"],
                description=form.cleaned_data["description"], actor=request.user).pk


@admin.register(ApiToken)
class ApiTokenAdmin(StrictFieldsMixin, admin.ModelAdmin):
    """Tokens are created here (the secret is shown once) and revoked, never edited."""

    list_display = ["key", "user", "name", "created_at", "expires_at", "revoked_at",
                    "last_used_at"]
    list_select_related = ["user"]
    search_fields = ["key", "user__username", "name"]
    actions = ["revoke"]

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_add_permission(self, request):
        return self.has_module_permission(request)

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        tokens = super().get_queryset(request)
        return tokens if request.user.is_superuser else tokens.filter(user=request.user)

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["user", "name", "expires_at"] if request.user.is_superuser else [
                "name", "expires_at"]
        return ["key", "user", "name", "created_at", "expires_at", "revoked_at",
                "last_used_at"]

    def save_model(self, request, obj, form, change):
        user = form.cleaned_data.get("user") or request.user
        token, secret = services.api_token_create(
            user=user, name=form.cleaned_data["name"],
            expires_at=form.cleaned_data["expires_at"], actor=request.user)
        obj.pk, obj.user, obj.key = token.pk, token.user, token.key
        self.message_user(
            request,
            f"Token for {user.get_username()} (shown only once, copy it now): {secret}",
            messages.WARNING,
        )

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset.filter(revoked_at__isnull=True):
            services.api_token_revoke(token=token, actor=request.user)
        self.message_user(request, "Revoked.")
