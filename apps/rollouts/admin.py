"""Rollouts in the admin: read-only, with their targets; confirm, roll back and
release the remaining pins through the services (at the version shown). Named
strategies (created and deleted by tenant owners; built-in ones read-only) and each
environment's default strategy, through apps.rollouts.strategies."""

from django import forms
from django.contrib import admin, messages
from django.db.models import Q

from apps.core.admin import OwnedAdminMixin, OwnedInlineMixin, ReadOnlyAdminMixin, pretty_json
from apps.core.errors import ApplicationError
from apps.environments.models import Environment
from apps.rollouts import services, strategies
from apps.rollouts.models import (
    EnvironmentStrategy,
    Rollout,
    RolloutStrategy,
    RolloutTarget,
    SnapshotQuarantine,
)
from apps.rollouts.quarantine import quarantine_lift
from apps.rollouts.strategy_rules import strategy_problems
from apps.tenancy.models import Role, Tenant


class RolloutTargetInline(OwnedInlineMixin, admin.TabularInline):
    model = RolloutTarget
    fields = ["agent", "wave", "state", "previous_snapshot", "activated_at", "generation"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("agent__environment",
                                                            "previous_snapshot")

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Rollout)
class RolloutAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["pk", "environment", "snapshot", "state", "current_wave", "version",
                    "created_at", "finished_at"]
    list_filter = ["state"]
    list_select_related = ["environment__application", "snapshot"]
    fields = ["environment", "snapshot", "strategy", "previous_snapshot", "state", "version",
              "waves_shown", "current_wave", "wave_started_at", "wave_timeout_s",
              "failure_threshold", "reason", "rollback_snapshot", "created_by", "created_at",
              "finished_at", "final_summary_shown"]
    readonly_fields = fields
    inlines = [RolloutTargetInline]
    actions = ["confirm", "roll_back", "release_pins"]

    @admin.display(description="waves")
    def waves_shown(self, obj):
        return pretty_json(obj.waves)

    @admin.display(description="final summary")
    def final_summary_shown(self, obj):
        return pretty_json(obj.final_summary)

    def get_queryset(self, request):
        return Rollout.objects.filter(environment__in=Environment.objects.owned_by(request.user))

    def _each(self, request, queryset, verb, service):
        for rollout in queryset:
            try:
                service(rollout=rollout, expected_version=rollout.version, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, f"Rollout {rollout.pk}: {exc.message}",
                                  messages.ERROR)
            else:
                self.message_user(request, f"Rollout {rollout.pk}: {verb}.", messages.SUCCESS)

    @admin.action(description="Confirm the current wave")
    def confirm(self, request, queryset):
        self._each(request, queryset, "wave confirmed", services.rollout_confirm)

    @admin.action(description="Roll back")
    def roll_back(self, request, queryset):
        def rollback(**kwargs):
            return services.rollout_rollback(reason="rolled back from the admin", **kwargs)

        self._each(request, queryset, "rolled back", rollback)

    @admin.action(description="Release the remaining pins")
    def release_pins(self, request, queryset):
        self._each(request, queryset, "pins released", services.rollout_pins_release)


@admin.register(SnapshotQuarantine)
class SnapshotQuarantineAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Quarantined content (by checksum, per environment); owners lift it here."""

    list_display = ["environment", "checksum", "snapshot", "rollout", "reason", "created_at"]
    list_select_related = ["environment__application", "snapshot"]
    fields = list_display
    readonly_fields = fields
    actions = ["lift"]

    def get_queryset(self, request):
        return SnapshotQuarantine.objects.filter(
            environment__in=Environment.objects.owned_by(request.user))

    @admin.action(description="Lift the quarantine")
    def lift(self, request, queryset):
        for quarantine in queryset.select_related("environment", "snapshot"):
            try:
                quarantine_lift(environment=quarantine.environment,
                                number=quarantine.snapshot.number, actor=request.user,
                                reason="lifted from the admin")
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.ERROR)
            else:
                self.message_user(request, f"Lifted the quarantine of "
                                           f"#{quarantine.snapshot.number}'s content.",
                                  messages.SUCCESS)


class StrategyForm(forms.ModelForm):
    """A tenant's new strategy, its definition checked as the API checks it."""

    class Meta:
        model = RolloutStrategy
        fields = ["tenant", "name", "description", "definition"]

    def clean_definition(self):
        problems = strategy_problems(self.cleaned_data["definition"])
        if problems:
            raise forms.ValidationError([f"{p['field']}: {p['message']}" for p in problems])
        return self.cleaned_data["definition"]


@admin.register(RolloutStrategy)
class RolloutStrategyAdmin(OwnedAdminMixin, admin.ModelAdmin):
    """Strategies are created and deleted, never edited; built-in ones are read-only."""

    form = StrategyForm
    list_display = ["name", "tenant", "description", "created_at"]
    list_select_related = ["tenant"]
    actions = ["delete_strategies"]

    def get_queryset(self, request):
        strategies = RolloutStrategy.objects.select_related("tenant")
        if request.user.is_superuser:
            return strategies
        return strategies.filter(Q(tenant__isnull=True) | Q(
            tenant__memberships__user=request.user, tenant__memberships__role=Role.OWNER))

    def get_readonly_fields(self, request, obj=None):
        return ["tenant", "name", "description", "definition"] if obj else []

    def get_form(self, request, obj=None, **kwargs):
        form = super().get_form(request, obj, **kwargs)
        if obj is None and "tenant" in form.base_fields:
            form.base_fields["tenant"].required = True
            if not request.user.is_superuser:
                form.base_fields["tenant"].queryset = Tenant.objects.filter(
                    memberships__user=request.user, memberships__role=Role.OWNER)
        return form

    def has_add_permission(self, request, *args):
        return request.user.is_active and request.user.is_staff

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        created = strategies.strategy_create(
            tenant=form.cleaned_data["tenant"], name=form.cleaned_data["name"],
            description=form.cleaned_data["description"],
            definition=form.cleaned_data["definition"], actor=request.user)
        obj.pk = created.pk

    @admin.action(description="Delete the selected strategies")
    def delete_strategies(self, request, queryset):
        for strategy in queryset.exclude(tenant__isnull=True):
            try:
                strategies.strategy_delete(strategy=strategy, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, exc.message, messages.ERROR)
            else:
                self.message_user(request, f"Deleted {strategy.name}.", messages.SUCCESS)


@admin.register(EnvironmentStrategy)
class EnvironmentStrategyAdmin(OwnedAdminMixin, admin.ModelAdmin):
    """An environment's default strategy, set and cleared through the service."""

    list_display = ["environment", "strategy", "set_by", "set_at"]
    list_select_related = ["environment__application", "strategy"]
    fields = ["environment", "strategy"]
    actions = ["clear"]

    def get_queryset(self, request):
        return EnvironmentStrategy.objects.filter(
            environment__in=Environment.objects.owned_by(request.user))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "environment":
            kwargs["queryset"] = Environment.objects.owned_by(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_add_permission(self, request, *args):
        return request.user.is_active and request.user.is_staff

    def has_delete_permission(self, request, obj=None):
        return False

    def save_model(self, request, obj, form, change):
        chosen = strategies.environment_strategy_set(
            environment=form.cleaned_data["environment"],
            strategy=form.cleaned_data["strategy"], actor=request.user)
        obj.pk = chosen.pk

    @admin.action(description="Clear the default strategy")
    def clear(self, request, queryset):
        for chosen in queryset.select_related("environment__application"):
            strategies.environment_strategy_set(environment=chosen.environment,
                                                strategy=None, actor=request.user)
        self.message_user(request, "Cleared.", messages.SUCCESS)
