"""Audit events of webhooks written before the log kept only a URL's scheme, host
and port: their URLs (whose path, query or credentials may hold a receiver's
secret) are cut down the same way (apps.webhooks.rules.url_shown, frozen here)."""

from urllib.parse import urlsplit

from django.db import migrations

ACTIONS = ("webhook.create", "webhook.update", "webhook.delete")


def _shown(url) -> str:
    try:
        parts = urlsplit(str(url))
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or any(not "!" <= c <= "~" for c in str(url)) or not parts.scheme.isalpha():
        return "(a URL that does not parse)"
    shown = f"{parts.scheme}://{f'[{host}]' if ':' in host else host}"
    shown += f":{port}" if port else ""
    return shown + ("/…" if parts.path.strip("/") or parts.query or parts.fragment else "/")


def _after(text: str, prefix: str, suffix: str = "") -> str | None:
    """`text` with the URL between `prefix` and `suffix` cut down, or None."""
    if not text.startswith(prefix) or not text.endswith(suffix):
        return None
    url = text[len(prefix):len(text) - len(suffix)] if suffix else text[len(prefix):]
    return prefix + _shown(url) + suffix


def redact(apps, schema_editor):
    AuditEvent = apps.get_model("audit", "AuditEvent")
    for event in AuditEvent.objects.filter(action__in=ACTIONS).iterator():
        pk = event.object_id
        data = dict(event.data or {})
        if "url" in data:
            data["url"] = _shown(data["url"])
        summary = event.summary
        if event.action == "webhook.create":
            events = data.get("events") if isinstance(data.get("events"), list) else []
            summary = f"Webhook {pk} to {data.get('url', '')} for {', '.join(map(str, events))}"
        elif event.action == "webhook.delete":
            summary = (_after(summary, f"Webhook {pk} to ", " deleted")
                       or f"Webhook {pk} deleted")
        shown_repr = event.object_repr.split(" to ", 1)
        object_repr = (f"{shown_repr[0]} to {_shown(shown_repr[1])}" if len(shown_repr) == 2
                       else event.object_repr)
        event.data, event.summary, event.object_repr = data, summary[:500], object_repr[:200]
        event.save(update_fields=["data", "summary", "object_repr"])


class Migration(migrations.Migration):

    dependencies = [
        ("webhooks", "0001_initial"),
        ("audit", "0011_governance_actions"),
    ]

    operations = [migrations.RunPython(redact, migrations.RunPython.noop)]
