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
        (entry["path"], entry["status"], _too_large(entry) if entry.get("too_large")
         else format_html_join(
            "", '<div class="{}">{}</div>',
            ((_line_class(line), line or " ") for line in entry["diff"].splitlines())))
        for entry in files))


def _too_large(entry: dict):
    def side(size, checksum):
        return "none" if size is None else f"{size} bytes, {checksum}"
    return format_html('<div class="hunk">{}</div><div>{} {}</div><div>{} {}</div>',
                       "Too large to show line by line.",
                       "before:", side(entry["old_bytes"], entry["old_checksum"]),
                       "after: ", side(entry["new_bytes"], entry["new_checksum"]))


@register.filter
def pretty_yaml(value) -> str:
    """A config as block-style YAML, keys in their own order."""
    return yaml.safe_dump(value, sort_keys=False, default_flow_style=False, allow_unicode=True)
