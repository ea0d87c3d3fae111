"""Template tags of the dashboard."""

from django import template
from django.utils.html import format_html

from apps.core.scheduler import scheduler_late_since

register = template.Library()


@register.simple_tag
def live_panel(panel: str, url: str, kinds: str, environment=None, every: str = ""):
    """The attributes of a panel's stable wrapper: it listens for the live events
    `kinds` (of `environment` only, when given: live.js also fires each event as
    `bw-<kind>-<environment id>`, as a trigger filter would need eval; its partial is then
    `url?panel=<panel>`), for resyncs and every `every`; refetches, one request
    queued behind one in flight; and is the target, so the section inside is
    replaced and the listener stays."""
    only = "" if environment is None else f"-{int(environment.pk)}"
    triggers = [f"bw-{kind}{only} from:body" for kind in kinds.split()]
    triggers.append("bw-resync from:body")
    if every:
        triggers.append(f"every {every}")
    return format_html(
        'id="{}-panel" hx-get="{}" hx-target="this" hx-swap="innerHTML" '
        'hx-sync="this:queue last" hx-disinherit="*" hx-trigger="{}"',
        panel, url if environment is None else f"{url}?panel={panel}", ", ".join(triggers))


@register.simple_tag
def scheduler_late():
    """When the scheduler was last seen, while it is late (apps.core.scheduler)."""
    return scheduler_late_since()
