"""Admin for environment owners: config, templates, fallback files, publishing.

Every save goes through apps.environments.services; querysets are scoped to
the environments the user owns.
"""

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.http import Http404
from django.shortcuts import redirect
from django.template.defaultfilters import filesizeformat
from django.urls import path
from django.utils.html import format_html, format_html_join
from django.views.decorators.http import require_POST

from apps.core.admin import OwnedAdminMixin, OwnedInlineMixin, StrictFieldsMixin
from apps.core.errors import ApplicationError
from apps.core.templatetags.bellwether import render_diff
from apps.core.validators import WholeNumberFormField
from apps.environments import services
from apps.environments.models import (
    SETTING_RANGES,
    Environment,
    FallbackFile,
    PlatformPolicy,
    Template,
)
from apps.environments.selectors import environment_limits, owner_candidates
from apps.releases import services as releases
from apps.releases.selectors import environments_with_storage, pending_view, retention_usage
from apps.tenancy.models import Application
from configlang.rendering import path_collisions


class CodeField(forms.CharField):
    """Text kept exactly as typed, except that browsers' CRLF line ends become LF."""

    def __init__(self, **kwargs):
        kwargs["strip"] = False
        super().__init__(**kwargs)

    def to_python(self, value):
        value = super().to_python(value)
        return value.replace("\r\n", "\n")


class EnvironmentForm(forms.ModelForm):
    # The version the page was loaded at: a save over someone else's change is refused.
    expected_version = WholeNumberFormField(required=False, min_value=1,
                                          widget=forms.HiddenInput)

    class Meta:
        model = Environment
        fields = ["application", "name", "config", "config_schema", "poll_interval_s",
                  "release_policy", "drift_policy", "keep_rollout_pins", *SETTING_RANGES,
                  "owners"]
        field_classes = {"config": CodeField}
        widgets = {"config": forms.Textarea(attrs={"rows": 20, "cols": 100,
                                                   "class": "bw-code"}),
                   "release_policy": forms.RadioSelect, "drift_policy": forms.RadioSelect}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["expected_version"].initial = self.instance.version

    def clean_expected_version(self):
        expected = self.cleaned_data["expected_version"]
        if self.instance.pk is not None and expected is not None:
            current = Environment.objects.filter(pk=self.instance.pk).values_list(
                "version", flat=True).first()
            if current != expected:
                raise forms.ValidationError(
                    f"The environment changed since you loaded it (version {current}, not "
                    f"{expected}). Reload the page and make your change again.")
        return expected

    def clean_config(self):
        config = self.cleaned_data["config"]
        try:
            services.check_config(config, environment_limits(self.instance))
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message) from None
        return config

    def clean(self):
        """A config that breaks the schema is refused here, naming the key, rather
        than saved to make the next publish invalid."""
        cleaned = super().clean()
        if "config" in cleaned and "config_schema" in cleaned:
            for problem in services.config_schema_problems(
                    cleaned["config"], cleaned["config_schema"],
                    environment_limits(self.instance)):
                where = f"{problem.key}: " if problem.key else ""
                self.add_error("config", f"Breaks the config schema: {where}{problem.message}")
        return cleaned

    def clean_config_schema(self):
        schema = self.cleaned_data["config_schema"]
        try:
            services.check_config_schema(schema)
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message) from None
        return schema


class EnvironmentFileForm(forms.ModelForm):
    kind: str
    text_field: str

    def clean(self):
        cleaned = super().clean()
        if self.cleaned_data.get("DELETE") or "path" not in cleaned:
            return cleaned
        if self.instance.pk is not None and not self.has_changed():
            return cleaned  # stored as it is: checked (and compiled) when it was saved
        try:
            services.check_file(self.kind, cleaned["path"], cleaned.get(self.text_field, ""),
                                environment_limits(self.instance))
        except ApplicationError as exc:
            raise forms.ValidationError(exc.message) from None
        return cleaned


class EnvironmentFileFormSet(forms.BaseInlineFormSet):
    """Refuses, with a form error, paths where one file would be another's directory."""

    def clean(self):
        super().clean()
        paths = [f.cleaned_data["path"] for f in self.forms
                 if f.cleaned_data.get("path") and not f.cleaned_data.get("DELETE")]
        collisions = path_collisions(paths)
        if collisions:
            parent, child = collisions[0]
            raise forms.ValidationError(f"{parent} is a file, so {child} cannot be written.")


class TemplateForm(EnvironmentFileForm):
    kind, text_field = "template", "source"

    class Meta:
        model = Template
        fields = ["path", "source"]
        field_classes = {"source": CodeField}
        widgets = {"source": forms.Textarea(attrs={"rows": 12, "cols": 100,
                                                   "class": "bw-code"})}


class FallbackFileForm(EnvironmentFileForm):
    kind, text_field = "fallback", "content"

    class Meta:
        model = FallbackFile
        fields = ["path", "content"]
        field_classes = {"content": CodeField}
        widgets = {"content": forms.Textarea(attrs={"rows": 8, "cols": 100,
                                                    "class": "bw-code"})}


class TemplateInline(OwnedInlineMixin, admin.StackedInline):
    model = Template
    form = TemplateForm
    formset = EnvironmentFileFormSet
    extra = 0


class FallbackFileInline(OwnedInlineMixin, admin.StackedInline):
    model = FallbackFile
    form = FallbackFileForm
    formset = EnvironmentFileFormSet
    extra = 0
    verbose_name = "safe fallback file"


@admin.register(Environment)
class EnvironmentAdmin(OwnedAdminMixin, admin.ModelAdmin):
    form = EnvironmentForm
    inlines = [TemplateInline, FallbackFileInline]
    list_display = ["full_name", "tenant", "release_policy", "drift_policy", "poll_interval_s",
                    "snapshot_counter", "stored", "updated_at"]
    list_filter = [("application__tenant", admin.RelatedOnlyFieldListFilter), "release_policy",
                   "drift_policy"]
    search_fields = ["name", "application__name"]
    readonly_fields = ["snapshot_counter", "storage", "pending"]
    filter_horizontal = ["owners"]
    actions = ["publish", "reset_inputs"]

    def get_queryset(self, request):
        return environments_with_storage(
            Environment.objects.owned_by(request.user).select_related("application__tenant"))

    def get_form(self, request, obj=None, change=False, **kwargs):
        form = super().get_form(request, obj, change=change, **kwargs)
        if "owners" in form.base_fields:
            form.base_fields["owners"].queryset = owner_candidates(user=request.user,
                                                                   environment=obj)
        if "application" in form.base_fields and not request.user.is_superuser:
            form.base_fields["application"].queryset = Application.objects.filter(
                tenant__memberships__user=request.user, tenant__memberships__role="owner")
        return form

    def get_readonly_fields(self, request, obj=None):
        fields = list(super().get_readonly_fields(request, obj))
        if obj is not None:
            fields += ["application", "name"]
        else:
            fields.remove("pending")
            fields.remove("storage")
        return fields

    @admin.display(description="Stored", ordering="stored_bytes")
    def stored(self, obj):  # against the retention bounds (one query per page)
        return (f"{filesizeformat(obj.stored_bytes)} of {filesizeformat(obj.retention_bytes)}; "
                f"{obj.snapshot_count} of {obj.retention_snapshots} snapshots")

    @admin.display(description="Storage against retention bounds")
    def storage(self, obj):
        usage = retention_usage(obj)
        return format_html(
            "<p>{} stored of {} ({}%); {} of {} snapshots; {} of {} finished rollouts. Beat "
            "removes the oldest unreferenced snapshots beyond the bounds.</p>",
            filesizeformat(usage["bytes"]["stored"]), filesizeformat(usage["bytes"]["bound"]),
            usage["bytes"]["stored"] * 100 // usage["bytes"]["bound"],
            usage["snapshots"]["count"], usage["snapshots"]["bound"],
            usage["rollouts"]["count"], usage["rollouts"]["bound"])

    @admin.display(ordering="application__tenant__name")
    def tenant(self, obj):
        return obj.application.tenant

    @admin.display(description="Pending changes")
    def pending(self, obj):
        try:
            pending = pending_view(obj)
        except ApplicationError as error:  # e.g. too many renders at once
            return format_html("<p>Pending changes are not shown: {}</p>", error.message)
        snapshot, against = pending["snapshot"], pending["against"]
        since = f"since #{snapshot.number} ({snapshot.label})" if snapshot else "never published"
        header = format_html("<p>{} change(s) waiting to roll out, {}.{}</p><p>{}</p>",
                             len(pending["events"]), since,
                             f" Diff against #{against.number}." if against else "",
                             pending["message"])
        if not pending["valid"]:
            # Problems quote the user's text (braces included): always an argument,
            # never part of a format string.
            problems = format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", (
                (" ".join(str(e[k]) for k in ("file", "line", "key", "message") if k in e),)
                for e in pending["errors"])))
            return format_html("{}<p>The current config does not render:</p>{}", header,
                               problems)
        return format_html("{}{}", header, render_diff(pending["files"]))

    def save_model(self, request, obj, form, change):
        if change:
            changes = {f: form.cleaned_data[f] for f in form.changed_data
                       if f in services.EDITABLE_FIELDS}
            if changes:
                releases.environment_update(
                    environment=obj, actor=request.user,
                    expected_version=form.cleaned_data.get("expected_version"), **changes)
        else:
            created = services.environment_create(
                application=form.cleaned_data["application"],
                name=form.cleaned_data["name"],
                config=form.cleaned_data["config"],
                config_schema=form.cleaned_data["config_schema"],
                poll_interval_s=form.cleaned_data["poll_interval_s"],
                release_policy=form.cleaned_data["release_policy"],
                drift_policy=form.cleaned_data["drift_policy"],
                actor=request.user,
            )
            bounds = {f: form.cleaned_data[f] for f in SETTING_RANGES if f in form.changed_data}
            if bounds:
                releases.environment_update(environment=created, actor=request.user, **bounds)
            obj.pk = created.pk

    def save_related(self, request, form, formsets, change):
        environment = Environment.objects.get(pk=form.instance.pk)
        services.environment_set_owners(environment=environment,
                                        owners=form.cleaned_data["owners"],
                                        actor=request.user)
        for formset in formsets:
            self.save_formset(request, form, formset, change)

    def save_formset(self, request, form, formset, change):
        environment = Environment.objects.get(pk=form.instance.pk)
        kind = formset.form.kind
        # The admin's change message reads these; the services did the saving.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for file_form in formset.forms:
            if not file_form.has_changed() and file_form.instance.pk is None:
                continue
            original = file_form.instance.pk and type(file_form.instance).objects.get(
                pk=file_form.instance.pk)
            if original and (file_form.cleaned_data.get("DELETE")
                             or original.path != file_form.cleaned_data["path"]):
                services.environment_file_delete(environment=environment, kind=kind,
                                                 path=original.path, actor=request.user)
            if not file_form.cleaned_data.get("DELETE") and file_form.has_changed():
                services.environment_file_put(
                    environment=environment, kind=kind, path=file_form.cleaned_data["path"],
                    text=file_form.cleaned_data[file_form.text_field], actor=request.user,
                )

    @admin.action(description="Reset the inputs to the active snapshot's source")
    def reset_inputs(self, request, queryset):
        for environment in queryset:
            try:
                releases.environment_inputs_reset(environment=environment, actor=request.user)
            except ApplicationError as exc:
                self.message_user(request, f"{environment}: {exc.message}", messages.ERROR)
            else:
                self.message_user(request, f"{environment}: inputs reset to the active "
                                           "snapshot's source.", messages.SUCCESS)

    @admin.action(description="Publish a snapshot of the selected environments")
    def publish(self, request, queryset):
        for environment in queryset:
            self._publish(request, environment)

    def _publish(self, request, environment) -> None:
        try:
            publication = releases.snapshot_publish(environment=environment, actor=request.user)
        except ApplicationError as exc:
            self.message_user(request, f"{environment}: {exc.message}", messages.ERROR)
            return
        publication.refresh_from_db()
        if publication.snapshot is None:
            self.message_user(request, f"{environment}: publication queued for rendering.")
        elif publication.deduplicated:
            self.message_user(request, f"{environment}: nothing changed since "
                                       f"#{publication.snapshot.number}.")
        elif publication.state == "invalid":
            self.message_user(request, f"{environment}: #{publication.snapshot.number} is "
                                       "invalid; see its report.", messages.ERROR)
        else:
            self.message_user(request, f"{environment}: published "
                                       f"#{publication.snapshot.number}.", messages.SUCCESS)

    def get_urls(self):
        publish = self.admin_site.admin_view(require_POST(self.publish_view))
        return [path("<path:object_id>/publish/", publish, name="environments_environment_publish"),
                *super().get_urls()]

    def publish_view(self, request, object_id):
        """The page's Publish button (POST): the action for this environment."""
        environment = self.get_object(request, unquote(object_id))
        if environment is None or not self.has_change_permission(request, environment):
            raise Http404("No such environment.")
        self._publish(request, environment)
        return redirect("admin:environments_environment_change", environment.pk)


class PlatformPolicyForm(forms.ModelForm):
    class Meta:
        model = PlatformPolicy
        fields = ["content"]

    def clean_content(self):
        content = self.cleaned_data["content"]
        if not isinstance(content, dict) or not isinstance(
                content.get("descriptor_policy", {}), dict):
            raise forms.ValidationError('Expected {"descriptor_policy": {...}}.')
        return content


@admin.register(PlatformPolicy)
class PlatformPolicyAdmin(StrictFieldsMixin, admin.ModelAdmin):
    """Superusers publish policy versions; a version is never edited, a new one is
    published instead (each snapshot records the version it used)."""

    form = PlatformPolicyForm
    list_display = ["version", "created_by", "created_at"]
    readonly_fields = ["version", "created_by", "created_at"]

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return self.has_module_permission(request)

    def has_add_permission(self, request):
        return request.user.is_superuser

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_changeform_initial_data(self, request):
        newest = PlatformPolicy.objects.order_by("-version").first()
        return {"content": newest.content if newest else {"descriptor_policy": {
            "params": [], "secret_refs": [], "rollback": False}}}

    def save_model(self, request, obj, form, change):
        policy = services.policy_publish(content=form.cleaned_data["content"],
                                         actor=request.user)
        obj.pk, obj.version, obj.created_by = policy.pk, policy.version, policy.created_by
