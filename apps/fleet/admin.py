"""Fleet in the admin: enrollment tokens (the secret shown once) and agents with
their status; every action goes through apps.fleet.services."""

from datetime import timedelta

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from apps.core.admin import OwnedAdminMixin, OwnedInlineMixin, ReadOnlyAdminMixin
from apps.core.errors import ApplicationError
from apps.core.validators import WholeNumberFormField
from apps.environments.models import Environment
from apps.fleet import enrollment, selectors, services
from apps.fleet.models import HELD, Agent, Deployment, EnrollmentToken
from apps.fleet.rules import enroll_command, health_text
from apps.releases import services as releases

DEPLOYMENT_HISTORY = 20


class EnrollmentTokenForm(forms.ModelForm):
    expires_in_hours = WholeNumberFormField(min_value=1, max_value=24 * 365, initial=24)

    class Meta:
        model = EnrollmentToken
        fields = ["environment", "name", "max_uses"]


@admin.register(EnrollmentToken)
class EnrollmentTokenAdmin(OwnedAdminMixin, admin.ModelAdmin):
    """Created here (the secret is shown once), revoked, never edited."""

    form = EnrollmentTokenForm
    list_display = ["key", "environment", "name", "uses", "max_uses", "expires_at",
                    "revoked_at"]
    list_select_related = ["environment__application"]
    actions = ["revoke"]

    def get_queryset(self, request):
        return EnrollmentToken.objects.filter(
            environment__in=Environment.objects.owned_by(request.user))

    def has_add_permission(self, request, *args):
        return request.user.is_active and request.user.is_staff

    def has_change_permission(self, request, obj=None):
        return False

    def get_fields(self, request, obj=None):
        if obj is None:
            return ["environment", "name", "max_uses", "expires_in_hours"]
        return ["key", "environment", "name", "uses", "max_uses", "expires_at", "revoked_at"]

    def change_view(self, request, object_id, form_url="", extra_context=None):
        """The token's page shows the command to run on a host; the secret was shown
        once, at creation, so it is a placeholder here."""
        command = enroll_command(server=request.build_absolute_uri("/"),
                                 enrollment_token="<the enrollment token shown at creation>")
        return super().change_view(request, object_id, form_url,
                                   {**(extra_context or {}), "enroll_command": command})

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "environment":
            kwargs["queryset"] = Environment.objects.owned_by(request.user).select_related(
                "application")
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def save_model(self, request, obj, form, change):
        token, secret = enrollment.enrollment_token_create(
            environment=form.cleaned_data["environment"], name=form.cleaned_data["name"],
            max_uses=form.cleaned_data["max_uses"], actor=request.user,
            expires_at=timezone.now() + timedelta(hours=form.cleaned_data["expires_in_hours"]))
        obj.pk, obj.key, obj.environment = token.pk, token.key, token.environment
        self.message_user(request, f"Enrollment token for {token.environment} (shown only "
                                   f"once, copy it now): {secret}", messages.WARNING)
        command = enroll_command(server=request.build_absolute_uri("/"),
                                 enrollment_token=secret)
        self.message_user(request, f"On the host, run (fill in the <placeholders>; "
                                   f"docs/agents.md runs it as a service): {command}",
                          messages.INFO)

    @admin.action(description="Revoke the selected enrollment tokens")
    def revoke(self, request, queryset):
        for token in queryset.filter(revoked_at__isnull=True):
            enrollment.enrollment_token_revoke(token=token, actor=request.user)
        self.message_user(request, "Revoked.")


class DecommissionedFilter(admin.SimpleListFilter):
    """Agents in service by default; decommissioned ones on demand."""

    title = "decommissioned"
    parameter_name = "decommissioned"

    def lookups(self, request, model_admin):
        return [("true", "Decommissioned"), ("any", "Any")]

    def queryset(self, request, queryset):
        if self.value() == "true":
            return queryset.decommissioned()
        if self.value() == "any":
            return queryset
        return queryset.in_service()


class HeldFilter(admin.SimpleListFilter):
    """Agents held on a snapshot (by an operator or a rollout), or following."""

    title = "held"
    parameter_name = "held"

    def lookups(self, request, model_admin):
        return [("operator", "By an operator"), ("rollout", "By a rollout"),
                ("no", "Not held")]

    def queryset(self, request, queryset):
        return {"operator": queryset.filter(pinned_snapshot__isnull=False,
                                            pin_rollout__isnull=True),
                "rollout": queryset.filter(pin_rollout__isnull=False),
                "no": queryset.exclude(HELD)}.get(self.value(), queryset)


class DeploymentInline(OwnedInlineMixin, admin.TabularInline):
    """The agent's deployment history, newest first (the last DEPLOYMENT_HISTORY)."""

    model = Deployment
    fields = ["created_at", "snapshot", "kind", "state", "message", "health", "created_by"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False
    ordering = ["-created_at"]
    verbose_name_plural = f"Deployments (the last {DEPLOYMENT_HISTORY}, newest first)"

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("snapshot", "created_by")

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        parent = obj

        class Newest(formset):
            def get_queryset(self):
                recent = Deployment.objects.filter(agent=parent).order_by("-created_at")
                ids = recent.values_list("pk", flat=True)[:DEPLOYMENT_HISTORY]
                return super().get_queryset().filter(pk__in=list(ids))

        return Newest

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Agent)
class AgentAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["name", "environment", "labels_text", "mode", "enabled", "online",
                    "held", "desired", "applied", "last_status", "last_report_at"]
    list_filter = [DecommissionedFilter, ("environment", admin.RelatedOnlyFieldListFilter),
                   HeldFilter, "mode", "enabled", "last_status"]
    list_select_related = ["environment__application", "pinned_snapshot"]
    search_fields = ["name", "environment__name", "environment__application__name"]
    fields = ["name", "environment", "labels_text", "mode", "enabled", "generation", "online",
              "held", "desired", "applied", "last_status", "last_message", "last_report_at",
              "health", "blocked", "token_key", "token_revoked_at", "created_at",
              "decommissioned_at"]
    readonly_fields = fields
    inlines = [DeploymentInline]
    actions = ["deploy_now", "switch_to_manual", "switch_to_auto_pull", "rotate_token",
               "revoke_token", "release_pin", "decommission"]

    def get_queryset(self, request):
        return selectors.agents_with_desired(Agent.objects.filter(
            environment__in=Environment.objects.owned_by(request.user)))

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        seen = selectors.last_seen(changelist.result_list)  # one cache read per page
        for agent in changelist.result_list:
            agent.status = selectors.agent_status(agent, seen.get(agent.pk))
        return changelist

    def _status(self, obj) -> dict:
        if not hasattr(obj, "status"):
            obj.status = selectors.agent_status(obj, selectors.last_seen([obj]).get(obj.pk))
        return obj.status

    @admin.display(boolean=True)
    def online(self, obj):
        return self._status(obj)["online"]

    @admin.display(description="desired")
    def desired(self, obj):
        desired = self._status(obj)["desired"]
        return f"#{desired['number']}" if desired else "-"

    @admin.display(description="applied")
    def applied(self, obj):
        applied = self._status(obj)["applied"]
        return f"#{applied['number']}" if applied else "-"

    @admin.display(description="labels")
    def labels_text(self, obj):
        return ", ".join(f"{k}={v}" for k, v in sorted(obj.labels.items())) or "-"

    @admin.display(description="held")
    def held(self, obj):
        """What holds the agent on a snapshot: an operator's pin or a rollout's."""
        if obj.pin_rollout_id:
            return f"by rollout {obj.pin_rollout_id}"
        if obj.pinned_snapshot_id:
            return f"on #{obj.pinned_snapshot.number} (operator)"
        return "-"

    @admin.display(description="health (last report)")
    def health(self, obj):
        return health_text(obj.last_health) or "-"

    @admin.display(description="blocked")
    def blocked(self, obj):
        return f"#{obj.blocked_number}" if obj.blocked_number else "-"

    def has_change_permission(self, request, obj=None):
        return False

    def _update(self, request, queryset, **changes):
        self._each(request, queryset, "Updated", lambda agent: services.agent_update(
            agent=agent, actor=request.user, **changes))

    @admin.action(description="Switch to manual (stay on the current snapshot)")
    def switch_to_manual(self, request, queryset):
        self._update(request, queryset, mode=Agent.Mode.MANUAL)

    @admin.action(description="Switch to auto pull (follow the active snapshot)")
    def switch_to_auto_pull(self, request, queryset):
        self._update(request, queryset, mode=Agent.Mode.AUTO_PULL)

    @admin.action(description="Revoke the agents' tokens")
    def revoke_token(self, request, queryset):
        for agent in queryset:
            enrollment.agent_token_revoke(agent=agent, actor=request.user)
        self.message_user(request, f"Revoked {queryset.count()} token(s).")

    def _each(self, request, queryset, verb: str, act) -> None:
        """Run `act(agent)` per agent; report each refusal, then how many succeeded."""
        done = 0
        for agent in queryset:
            try:
                act(agent)
                done += 1
            except ApplicationError as error:
                self.message_user(request, f"{agent}: {error.message}", messages.ERROR)
        if done:
            self.message_user(request, f"{verb} {done} agent(s).", messages.SUCCESS)

    @admin.action(description="Deploy the active snapshot to the selected agents now")
    def deploy_now(self, request, queryset):
        by_environment: dict = {}
        for agent in queryset.select_related("environment__active_snapshot"):
            by_environment.setdefault(agent.environment, []).append(agent.pk)
        for environment, agent_ids in by_environment.items():
            snapshot = environment.active_snapshot
            if snapshot is None:
                self.message_user(request, f"{environment}: nothing is active yet.",
                                  messages.ERROR)
                continue
            try:
                pushed = releases.snapshot_deploy(snapshot=snapshot, agent_ids=agent_ids,
                                                  actor=request.user)
            except ApplicationError as error:
                self.message_user(request, f"{environment}: {error.message}", messages.ERROR)
                continue
            self.message_user(request, f"{environment}: pushed #{snapshot.number} to "
                                       f"{len(pushed)} agent(s).", messages.SUCCESS)

    @admin.action(description="Rotate the agents' tokens (new secrets shown once)")
    def rotate_token(self, request, queryset):
        for agent in queryset:
            try:
                secret = enrollment.agent_token_rotate(agent=agent, actor=request.user)
            except ApplicationError as error:
                self.message_user(request, f"{agent}: {error.message}", messages.ERROR)
                continue
            self.message_user(request, f"New token for {agent} (shown only once; put it "
                                       f"in the agent's config now): {secret}", messages.WARNING)

    @admin.action(description="Decommission the agents (token revoked, history kept, "
                              "name free)")
    def decommission(self, request, queryset):
        def decommission(agent):
            # As for release_pin: the generation read now only refuses a racing change.
            releases.agent_decommission(agent=agent, expected_generation=agent.generation,
                                        actor=request.user)

        self._each(request, queryset, "Decommissioned", decommission)

    @admin.action(description="Release the agents' pins (operator's or a rollout's)")
    def release_pin(self, request, queryset):
        def release(agent):
            # An admin action carries no generation from the page, so this is the one
            # read now: it only refuses a change racing this action.
            releases.pin_release(agent=agent, rollout_id=agent.pin_rollout_id,
                                 expected_generation=agent.generation, actor=request.user)

        self._each(request, queryset, "Released the pins of", release)
