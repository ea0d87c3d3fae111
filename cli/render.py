"""How the CLI shows things: tables and text through rich for people, one JSON
document on stdout with --output json for scripts. Everything the server sent is
shown as plain text (never as rich markup), with control characters replaced."""

from __future__ import annotations

import json
import re
import sys

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from cli.errors import CliError, Refused
from cli.progress import summary_line, wave_line, wave_rows

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
BAR_WIDTH = 24


def shown(value) -> Text:
    """A value from the server as inert text: no markup, no terminal escapes."""
    text = "" if value is None else str(value)
    return Text(CONTROL.sub("\ufffd", text))


class Output:
    """--output text (rich, to a terminal or not) or json (one document on stdout;
    notes and errors as text on stderr, the error also as JSON on stdout)."""

    def __init__(self, mode: str = "text", stdout=None, stderr=None):
        self.mode = mode
        self.stdout = Console(file=stdout or sys.stdout, highlight=False, soft_wrap=True)
        self.stderr = Console(file=stderr or sys.stderr, highlight=False, soft_wrap=True)

    @property
    def is_json(self) -> bool:
        return self.mode == "json"

    def data(self, document) -> None:
        self.stdout.file.write(json.dumps(document, indent=2, sort_keys=False) + "\n")
        self.stdout.file.flush()

    def line(self, text, style: str | None = None) -> None:
        if not self.is_json:
            self.stdout.print(shown(text) if not isinstance(text, Text) else text, style=style)

    def note(self, text: str) -> None:
        self.stderr.print(shown(text), style="yellow")

    def table(self, columns: list[str], rows: list[list], title: str | None = None) -> None:
        table = Table(*columns, title=title, title_justify="left", show_edge=False)
        for row in rows:
            table.add_row(*(shown(cell) for cell in row))
        self.stdout.print(table)

    def error(self, exc: CliError) -> None:
        if self.is_json:
            self.data(exc.as_json())
        self.stderr.print(Text.assemble(("error: ", "bold red"), shown(headline(exc))))
        for item in exc.details:
            self.stderr.print(Text("  - ") + shown(detail_line(item)))


def headline(exc: CliError) -> str:
    if isinstance(exc, Refused):
        where = f" ({exc.method} {exc.path})" if exc.path else ""
        return f"{exc.status} {exc.code}: {exc.message}{where}"
    return exc.message


def detail_line(item) -> str:
    """One item of the envelope's details: a field's message, a problem at a
    file:line (and key), or whatever else the server listed, as JSON."""
    if not isinstance(item, dict):
        return str(item)
    where = item.get("field") or ":".join(
        str(item[k]) for k in ("file", "line") if item.get(k) is not None)
    if item.get("key"):
        where = f"{where} [{item['key']}]" if where else str(item["key"])
    if "message" in item:
        code = f"{item['code']}: " if item.get("code") else ""
        return f"{where}: {code}{item['message']}" if where else f"{code}{item['message']}"
    return json.dumps(item, sort_keys=True)


# --- following a rollout ---------------------------------------------------------------


class LineDisplay:
    """Not a terminal (CI logs): a line whenever what is shown changes."""

    def __init__(self, output: Output, console: Console):
        self.output, self.console, self.last = output, console, None

    def update(self, rollout: dict) -> None:
        lines = [summary_line(rollout), *(wave_line(r) for r in wave_rows(rollout))]
        if lines != self.last:
            self.last = lines
            for line in lines:
                self.console.print(shown(line))

    def note(self, text: str) -> None:
        self.output.note(text)

    def close(self) -> None:
        pass


class LiveDisplay:
    """A terminal: a progress bar per wave (activated and acknowledged), redrawn."""

    def __init__(self, output: Output, console: Console):
        self.output = output
        self.live = Live(Text("waiting for the rollout…"), console=console,
                         auto_refresh=False, transient=False)
        self.live.start()

    def update(self, rollout: dict) -> None:
        self.live.update(rollout_view(rollout), refresh=True)

    def note(self, text: str) -> None:
        self.live.console.print(shown(text), style="yellow")

    def close(self) -> None:
        self.live.stop()


def rollout_view(rollout: dict) -> Group:
    table = Table("wave", "gate", "activated", "", "acknowledged", "", "failed",
                  show_edge=False, box=None, pad_edge=False)
    for row in wave_rows(rollout):
        total = max(row.targets, 1)
        table.add_row(
            shown(row.label), shown(row.gate),
            ProgressBar(total=total, completed=row.activated, width=BAR_WIDTH),
            shown(f"{row.activated}/{row.targets}"),
            ProgressBar(total=total, completed=row.acknowledged, width=BAR_WIDTH,
                        complete_style="green", finished_style="green"),
            shown(f"{row.acknowledged}/{row.targets}"),
            Text(str(row.failed), style="red" if row.failed else ""))
    return Group(Text.assemble(("", ""), shown(summary_line(rollout)), style="bold"), table)


def rollout_display(output: Output):
    """Where progress goes: stderr with --output json (stdout holds the document),
    else stdout; live bars on a terminal, plain lines otherwise."""
    console = output.stderr if output.is_json else output.stdout
    if console.is_terminal and not output.is_json:
        return LiveDisplay(output, console)
    return LineDisplay(output, console)
