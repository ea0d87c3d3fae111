"""Snapshots in the admin: read-only, with their files, report and diff."""

from django.contrib import admin
from django.db.models import F
from django.utils.html import format_html, format_html_join

from apps.core.admin import ReadOnlyAdminMixin
from apps.core.templatetags.bellwether import render_diff
from apps.environments.models import Environment
from apps.snapshots.models import Snapshot
from apps.snapshots.selectors import snapshot_diff


@admin.register(Snapshot)
class SnapshotAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["environment", "number", "label", "state", "short_checksum", "author",
                    "rolled_back_from_number", "created_at"]
    list_filter = ["state", ("environment__application", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["environment__application", "author"]
    search_fields = ["label", "checksum", "environment__name", "environment__application__name"]
    fields = ["environment", "number", "label", "state", "checksum", "author", "parent",
              "rolled_back_from", "created_at", "problems", "diff", "file_list"]
    readonly_fields = fields

    def get_queryset(self, request):
        return Snapshot.objects.filter(
            environment__in=Environment.objects.owned_by(request.user)
        ).annotate(rolled_back_number=F("rolled_back_from__number")).defer(
            "source", "effective_config", "files", "fallback_files", "bundle")

    @admin.display(description="checksum")
    def short_checksum(self, obj):
        return obj.checksum[:19] if obj.checksum else "-"

    @admin.display(description="rolled back from")
    def rolled_back_from_number(self, obj):
        return obj.rolled_back_number or "-"

    @admin.display(description="Problems")
    def problems(self, obj):
        errors = obj.report.get("errors", [])
        if not errors:
            return "None"
        return format_html("<ul>{}</ul>", format_html_join("", "<li>{}</li>", (
            (" ".join(str(e[k]) for k in ("file", "line", "key") if k in e) + ": "
             + e["message"],) for e in errors)))

    @admin.display(description="Diff against the previous ready snapshot")
    def diff(self, obj):
        if not obj.is_ready:
            return "Invalid snapshots have no files."
        result = snapshot_diff(snapshot=obj)
        if result["against"] is None:
            return format_html("<p>First snapshot of {}.</p>{}", obj.environment,
                               render_diff(result["files"]))
        return format_html("<p>Against #{}:</p>{}", result["against"],
                           render_diff(result["files"]))

    @admin.display(description="Files")
    def file_list(self, obj):
        return format_html_join("", '<h4 class="bw-file-head">{}</h4><pre class="bw-file">{}</pre>',
                                ((f["path"], f["content"]) for f in obj.files))
