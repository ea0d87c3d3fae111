"""Helpers for the admin tests: URLs, change-form POST data, changelist contents."""

import json

from apps.environments.models import SETTING_RANGES, Environment

ENVIRONMENTS = "/admin/environments/environment/"
SNAPSHOTS = "/admin/snapshots/snapshot/"
AUDIT_EVENTS = "/admin/audit/auditevent/"
TENANTS = "/admin/tenancy/tenant/"
API_TOKENS = "/admin/tenancy/apitoken/"


def change_url(changelist: str, pk) -> str:
    return f"{changelist}{pk}/change/"


def listed(response) -> list:
    """The objects a changelist page shows."""
    assert response.status_code == 200, response.status_code
    return list(response.context["cl"].result_list)


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def template_rows(environment: Environment) -> list[dict]:
    return [{"id": t.pk, "path": t.path, "source": t.source}
            for t in environment.templates.order_by("path")]


def fallback_rows(environment: Environment) -> list[dict]:
    return [{"id": f.pk, "path": f.path, "content": f.content}
            for f in environment.fallback_files.order_by("path")]


def inline_data(prefix: str, environment: Environment, rows: list[dict]) -> dict:
    """An inline formset as the admin posts it: the management form, then one block per
    row (existing rows, which carry their id, first). A row with DELETE=True is deleted."""
    existing = [row for row in rows if row.get("id")]
    added = [row for row in rows if not row.get("id")]
    data = {
        f"{prefix}-TOTAL_FORMS": str(len(rows)),
        f"{prefix}-INITIAL_FORMS": str(len(existing)),
        f"{prefix}-MIN_NUM_FORMS": "0",
        f"{prefix}-MAX_NUM_FORMS": "1000",
    }
    for index, row in enumerate(existing + added):
        data[f"{prefix}-{index}-id"] = str(row.get("id") or "")
        data[f"{prefix}-{index}-environment"] = str(environment.pk)
        for field, value in row.items():
            if field == "DELETE":
                if value:
                    data[f"{prefix}-{index}-DELETE"] = "on"
            elif field != "id":
                data[f"{prefix}-{index}-{field}"] = value
    return data


def environment_form(environment: Environment, *, templates: list[dict] | None = None,
                     fallback_files: list[dict] | None = None, **fields) -> dict:
    """POST data for the environment change page: the stored values, with `fields`
    replacing some of them. The inline prefixes are the related names."""
    environment.refresh_from_db()
    data = {
        "config": environment.config,
        "config_schema": (json.dumps(environment.config_schema)
                          if environment.config_schema is not None else ""),
        "poll_interval_s": str(environment.poll_interval_s),
        "release_policy": environment.release_policy,
        "drift_policy": environment.drift_policy,
        **{field: str(getattr(environment, field)) for field in SETTING_RANGES},
        "expected_version": str(environment.version),
        "owners": [str(pk) for pk in environment.owners.values_list("pk", flat=True)],
        "_save": "Save",
        **fields,
    }
    data.update(inline_data("templates", environment,
                            template_rows(environment) if templates is None else templates))
    data.update(inline_data("fallback_files", environment,
                            fallback_rows(environment) if fallback_files is None
                            else fallback_files))
    return data
