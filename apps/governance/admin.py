"""Governance in the admin, for environment owners: the approval rule (saved
through approval_rule_set), freezes and allow windows (created and deleted through
the window services, never edited), releases with their decisions (approved from a
page showing their content, naming it), overrides and scheduled releases (cancel) read-only."""

from datetime import datetime

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import widgets
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.template.response import TemplateResponse

from apps.core.admin import OwnedAdminMixin, OwnedInlineMixin, ReadOnlyAdminMixin, pretty_json
from apps.core.errors import ApplicationError
from apps.environments.models import Environment
from apps.governance import schedules, services, windows
from apps.governance.models import (
    Approval,
    ApprovalRule,
    FreezeOverride,
    ReleaseRequest,
    ReleaseWindow,
    ScheduledRelease,
)


class _Owned:
    def get_queryset(self, request):
        return super().get_queryset(request).filter(
            environment__in=Environment.objects.owned_by(request.user))


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(_Owned, OwnedAdminMixin, admin.ModelAdmin):
    list_display = ["environment", "required_approvals", "owners_approve", "strict",
                    "admins_may_skip", "version"]
    fields = ["environment", "required_approvals", "owners_approve", "approver_groups",
              "admins_may_skip", "strict"]

    def get_readonly_fields(self, request, obj=None):
        return ["environment"] if obj else []

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        saved = services.approval_rule_set(
            environment=obj.environment, actor=request.user,
            required_approvals=data["required_approvals"],
            owners_approve=data["owners_approve"],
            approver_groups=[g.name for g in data["approver_groups"]],
            admins_may_skip=data["admins_may_skip"], strict=data["strict"])
        obj.pk = saved.pk

    def save_related(self, request, form, formsets, change):
        """The groups were set by approval_rule_set (audited with the rule)."""


class WallClockField(forms.SplitDateTimeField):
    """A date and a time as typed, without an offset: window_checked reads it in the
    window's own timezone (as the API does), never the server's."""

    widget = widgets.AdminSplitDateTime

    def compress(self, data_list):
        if not data_list:
            return None
        for part, code in zip(data_list, ("invalid_date", "invalid_time"), strict=True):
            if part in self.empty_values:
                raise forms.ValidationError(self.error_messages[code], code=code)
        return datetime.combine(*data_list)


class WindowForm(forms.ModelForm):
    starts_at = WallClockField(required=False, help_text="In the window's timezone (once).")
    ends_at = WallClockField(required=False, help_text="In the window's timezone (once).")

    class Meta:
        model = ReleaseWindow
        fields = ["environment", "kind", "name", "reason", "timezone", "starts_at", "ends_at",
                  "weekdays", "start_time", "end_time"]

    def clean(self):
        data = super().clean()
        try:
            windows.window_checked(data.get("kind", ""), data.get("name", ""),
                                   data.get("timezone", ""), data.get("starts_at"),
                                   data.get("ends_at"), data.get("weekdays"),
                                   data.get("start_time"), data.get("end_time"))
        except ApplicationError as error:
            field = (error.details or {}).get("field")
            self.add_error(field if field in self.fields else None, error.message)
        return data


@admin.register(ReleaseWindow)
class ReleaseWindowAdmin(_Owned, OwnedAdminMixin, admin.ModelAdmin):
    form = WindowForm
    list_display = ["environment", "kind", "name", "timezone", "starts_at", "ends_at",
                    "weekdays", "start_time", "end_time"]
    list_filter = ["kind"]

    def has_change_permission(self, request, obj=None):
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        data = form.cleaned_data
        created = windows.window_create(
            environment=data["environment"], actor=request.user, kind=data["kind"],
            name=data["name"], reason=data.get("reason", ""), timezone_name=data["timezone"],
            starts_at=data.get("starts_at"), ends_at=data.get("ends_at"),
            weekdays=data.get("weekdays"), start_time=data.get("start_time"),
            end_time=data.get("end_time"))
        obj.pk = created.pk

    def delete_model(self, request, obj):
        windows.window_delete(window=obj, actor=request.user)

    def delete_queryset(self, request, queryset):
        for window in queryset:
            windows.window_delete(window=window, actor=request.user)


MAX_APPROVED_AT_ONCE = 100


class ReviewedContentForm(forms.Form):
    """The content of one release as the approval page showed it (hidden inputs)."""

    checksum = forms.CharField(max_length=71, widget=forms.HiddenInput)
    plan_digest = forms.CharField(max_length=64, widget=forms.HiddenInput)

    @classmethod
    def of(cls, release: ReleaseRequest) -> "ReviewedContentForm":
        return cls(prefix=f"release-{release.pk}", initial={
            "checksum": release.checksum, "plan_digest": release.plan_digest})


class DecisionCommentForm(forms.Form):
    comment = forms.CharField(max_length=2000, required=False, widget=forms.Textarea(
        attrs={"rows": 2, "cols": 60}))


class ApprovalInline(OwnedInlineMixin, admin.TabularInline):
    model = Approval
    fields = ["approver", "decision", "checksum", "plan_digest", "comment", "created_at",
              "cancelled_at", "cancel_reason"]
    readonly_fields = fields
    extra = 0
    max_num = 0
    can_delete = False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ReleaseRequest)
class ReleaseRequestAdmin(_Owned, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["pk", "environment", "snapshot", "state", "version", "requested_by",
                    "created_at"]
    list_filter = ["state"]
    list_select_related = ["environment__application", "snapshot", "requested_by"]
    fields = ["environment", "snapshot", "checksum", "plan", "plan_digest", "rule", "state",
              "version", "note", "requested_by", "skipped_by", "skip_reason", "created_at",
              "released_at"]
    readonly_fields = fields
    inlines = [ApprovalInline]
    actions = ["approve"]

    @admin.action(description="Approve the selected releases (after seeing their content)")
    def approve(self, request, queryset):
        """First a page showing each release's content (its snapshot's checksum, its
        plan and digest); approving there names the content shown, so a release
        changed since is refused (stale), never approved unseen."""
        releases = list(queryset.select_related("snapshot", "environment__application")
                        .order_by("pk")[:MAX_APPROVED_AT_ONCE])
        if request.POST.get("reviewed") != "yes":
            return TemplateResponse(request, "admin/governance/releaserequest/approve.html", {
                **self.admin_site.each_context(request), "title": "Approve these releases?",
                "opts": self.model._meta, "action_checkbox_name": ACTION_CHECKBOX_NAME,
                "comment": DecisionCommentForm(),
                "rows": [(release, pretty_json(release.plan), ReviewedContentForm.of(release))
                         for release in releases]})
        comment = DecisionCommentForm(request.POST)
        text = comment.cleaned_data["comment"] if comment.is_valid() else ""
        for release in releases:
            self._approve(request, release, ReviewedContentForm(
                request.POST, prefix=f"release-{release.pk}"), text)

    def _approve(self, request, release: ReleaseRequest, shown, comment: str) -> None:
        if not shown.is_valid():
            self.message_user(request, f"Release {release.pk} not approved: approve it from "
                                       "the page that shows its content.", messages.ERROR)
            return
        try:
            services.release_decide(release=release, actor=request.user, decision="approve",
                                    comment=comment, **shown.cleaned_data)
        except ApplicationError as error:
            self.message_user(request, f"Release {release.pk}: {error.message}", messages.ERROR)
        else:
            self.message_user(request, f"Release {release.pk} approved.")


@admin.register(FreezeOverride)
class FreezeOverrideAdmin(_Owned, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["environment", "reason", "starts_at", "ends_at", "created_by"]


@admin.register(ScheduledRelease)
class ScheduledReleaseAdmin(_Owned, ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["pk", "environment", "release", "run_at", "state", "outcome_code"]
    list_filter = ["state"]
    readonly_fields = ["environment", "release", "run_at", "expected_active_snapshot",
                       "expected_release_version", "confirmed", "state", "outcome_code",
                       "outcome",
                       "result", "created_by", "created_at", "finished_at"]
    actions = ["cancel"]

    @admin.action(description="Cancel")
    def cancel(self, request, queryset):
        for schedule in queryset:
            try:
                schedules.schedule_cancel(schedule=schedule, actor=request.user)
            except ApplicationError as error:
                self.message_user(request, f"Schedule {schedule.pk}: {error.message}",
                                  messages.ERROR)
