"""Template filters shared by the admin and the dashboard."""

import yaml
from django import template
from django.utils.html import format_html, format_html_join

register = template.Library()


def _line_class(line: str) -> str:
    if line.startswith(("+++", "---")):
        return "head"
    return {"+": "add", "-": "del", "@": "hunk"}.get(line[:1], "")


@register.filter
def render_diff(files: list[dict]):
    """Per-file unified diffs as HTML (escaped; styled by static/bellwether/*.css)."""
    if not files:
        return format_html("<p>{}</p>", "No file changes.")
    return format_html_join("", '<h4 class="bw-file-head">{} <small>({})</small></h4>'
                            '<pre class="bw-diff">{}</pre>', (
        (entry["path"], entry["status"], format_html_join(
            "", '<div class="{}">{}</div>',
            ((_line_class(line), line or " ") for line in entry["diff"].splitlines())))
        for entry in files))


@register.filter
def pretty_yaml(value) -> str:
    """A config as block-style YAML, keys in their own order."""
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, allow_unicode=True)
