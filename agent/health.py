"""The health probe after a reload (docs/agents.md): a command that must exit 0
and/or an HTTP URL that must answer 2xx, tried a few times, so a snapshot that
reloads cleanly but leaves the service unhealthy is restored like a failed one
and fails its rollout wave."""

from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass

logger = logging.getLogger("agent.health")

COMMAND, URL = "command", "url"
# What a report and a message keep of a probe's output (its end: where errors are).
OUTPUT_KEPT = 500
# What is read of a health URL's body: enough for its message, never the whole page.
BODY_READ = 4096


@dataclass(frozen=True)
class Probe:
    """What to probe and how often: `attempts` tries, `interval_s` apart, each
    command or request killed (or abandoned) after `timeout_s`."""

    command: str | None = None
    url: str | None = None
    timeout_s: float = 10.0
    attempts: int = 3
    interval_s: float = 2.0

    @property
    def is_configured(self) -> bool:
        return bool(self.command or self.url)


@dataclass(frozen=True)
class Health:
    """The result of a probe: the last attempt's probe and output."""

    ok: bool
    attempts: int
    output: str
    probe: str

    def report(self) -> dict:
        """The `health` object of a report (docs/api.md)."""
        return {"ok": self.ok, "attempts": self.attempts, "output": self.output,
                "probe": self.probe}

    def describe(self) -> str:
        state = "healthy" if self.ok else "failed"
        detail = f": {self.output}" if self.output else ""
        return f"health {self.probe} {state} after {self.attempts} attempt(s){detail}"


def tail(text: str, limit: int = OUTPUT_KEPT) -> str:
    """The end of `text`, stripped, at most `limit` characters, no NUL."""
    text = text.replace("\x00", "").strip()
    return text if len(text) <= limit else "…" + text[-(limit - 1):]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is an answer, not a 2xx: the probe never follows it elsewhere."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def shown(url: str) -> str:
    """`url` as reports and logs show it: without user, password and query (where
    a monitoring URL keeps its credentials)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    return urllib.parse.urlunsplit((parts.scheme, host + port, parts.path,
                                    "…" if parts.query else "", ""))


def url_check(url: str, timeout_s: float) -> tuple[bool, str, bool]:
    """GET `url`: (whether it answered 2xx, "HTTP <status>: <start of the body>" or
    why nothing answered, whether the body was cut at BODY_READ). No proxy from the
    environment, no redirect followed; the timeout bounds the connection and each
    read."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect)
    request = urllib.request.Request(url, headers={"User-Agent": "bellwether-agent health"})
    try:
        with opener.open(request, timeout=timeout_s) as response:
            status, body = response.status, response.read(BODY_READ)
    except urllib.error.HTTPError as exc:
        status = exc.code
        try:
            body = exc.read(BODY_READ)
        except (OSError, http.client.HTTPException):
            body = b""
        exc.close()
    except urllib.error.URLError as exc:
        return False, f"GET {shown(url)}: {exc.reason}", False
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return False, f"GET {shown(url)}: {exc or type(exc).__name__}", False
    text = body.decode("utf-8", "replace").strip()
    return (200 <= status < 300, f"HTTP {status}" + (f": {text}" if text else ""),
            len(body) >= BODY_READ)


def check(probe: Probe, run_command, sleep, redact=lambda text, cut=False: text) -> Health:
    """Try `probe` up to its attempts: each runs the command (`run_command(command,
    timeout_s)` -> (ok, output)), then, if it passed, the URL. Healthy at the first
    attempt where everything passed; else failed with the last attempt's output.
    `redact(text, cut=...)` runs on a URL's answer before anything of it is kept
    or logged (`cut`: the body was cut short, maybe inside a secret)."""
    ok, kind, output = False, COMMAND, ""
    for attempt in range(1, probe.attempts + 1):
        if attempt > 1:
            logger.info("health %s failed (%s); trying again in %gs", kind, output,
                        probe.interval_s)
            sleep(probe.interval_s)
        ok = True
        if probe.command:
            kind = COMMAND
            ok, output = run_command(probe.command, probe.timeout_s)
        if ok and probe.url:
            kind = URL
            ok, output, cut = url_check(probe.url, probe.timeout_s)
            output = redact(output, cut=cut)
        if ok:
            return Health(True, attempt, tail(output), kind)
    return Health(False, probe.attempts, tail(output), kind)
