"""Admin plumbing shared by the apps: ownership-scoped permissions, and the API's
rules for the numbers of every form (names, labels and paths carry theirs on the
model fields: apps.core.validators)."""

import json

from django.db import models
from django.utils.html import format_html

from apps.core.validators import WholeNumberFormField


class StrictFieldsMixin:
    """Integers in the admin's forms are ASCII digits, as in the API."""

    formfield_overrides = {models.IntegerField: {"form_class": WholeNumberFormField},
                           models.BigIntegerField: {"form_class": WholeNumberFormField}}


class OwnedAdminMixin(StrictFieldsMixin):
    """Staff see and change only what their queryset (scoped in get_queryset) holds;
    adding and deleting is for superusers."""

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def _in_scope(self, request, obj) -> bool:
        if request.user.is_superuser:
            return True
        if not (request.user.is_active and request.user.is_staff):
            return False
        return obj is None or self.get_queryset(request).filter(pk=obj.pk).exists()

    def has_view_permission(self, request, obj=None):
        return self._in_scope(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._in_scope(request, obj)

    def has_add_permission(self, request, *args):
        return request.user.is_superuser

    def has_delete_permission(self, request, obj=None):
        return request.user.is_superuser


class ReadOnlyAdminMixin(OwnedAdminMixin):
    """Records that are never edited by hand (snapshots, audit events)."""

    def has_change_permission(self, request, obj=None):
        return False

    def has_add_permission(self, request, *args):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class OwnedInlineMixin(StrictFieldsMixin):
    """Inline rows may be edited by whoever may change the parent object."""

    def _parent_allows(self, request, obj) -> bool:
        parent_admin = self.admin_site._registry[self.parent_model]
        return parent_admin.has_change_permission(request, obj)

    def has_view_permission(self, request, obj=None):
        return self.admin_site._registry[self.parent_model].has_view_permission(request, obj)

    def has_add_permission(self, request, obj=None):
        return self._parent_allows(request, obj)

    def has_change_permission(self, request, obj=None):
        return self._parent_allows(request, obj)

    def has_delete_permission(self, request, obj=None):
        return self._parent_allows(request, obj)


def pretty_json(value) -> str:
    """A JSON value as the admin shows it read-only: indented, keys sorted."""
    if value is None:
        return "-"
    return format_html('<pre class="bw-json">{}</pre>',
                       json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False))
