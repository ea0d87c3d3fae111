"""Rollouts in the admin: read-only, with their targets; confirm, roll back and
release the remaining pins through the services (at the version shown)."""

from django.contrib import admin, messages

from apps.core.admin import OwnedInlineMixin, ReadOnlyAdminMixin, pretty_json
from apps.core.errors import ApplicationError
from apps.environments.models import Environment
from apps.rollouts import services
from apps.rollouts.models import Rollout, RolloutTarget, SnapshotQuarantine
from apps.rollouts.quarantine import quarantine_lift


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
    fields = ["environment", "snapshot", "previous_snapshot", "state", "version",
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
