"""The audit log in the admin: read-only, scoped to what the user owns."""

from django.contrib import admin
from django.db.models import Q

from apps.audit.models import AuditEvent
from apps.core.admin import ReadOnlyAdminMixin, pretty_json
from apps.environments.models import Environment


@admin.register(AuditEvent)
class AuditEventAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    list_display = ["created_at", "actor_name", "action", "object_repr", "environment",
                    "summary"]
    list_filter = ["action"]
    list_select_related = ["environment__application"]
    search_fields = ["summary", "object_repr", "actor_name"]
    fields = [f.name if f.name != "data" else "data_shown" for f in AuditEvent._meta.fields]
    readonly_fields = fields

    @admin.display(description="data")
    def data_shown(self, obj):
        return pretty_json(obj.data)

    def get_queryset(self, request):
        events = super().get_queryset(request)
        if request.user.is_superuser:
            return events
        return events.filter(
            Q(environment__in=Environment.objects.owned_by(request.user))
            | Q(environment__isnull=True, tenant__memberships__user=request.user,
                tenant__memberships__role="owner")
        ).distinct()
