"""Agent configuration: flags over environment variables over a config file."""

from __future__ import annotations

import argparse
import configparser
import math
import os
import socket
import sys
import urllib.parse
from dataclasses import dataclass, field

from agent.files import make_directories

ENV_PREFIX = "BELLWETHER_"
STATE_ROOT = "/var/lib/bellwether"


def host_name() -> str:
    return socket.gethostname().split(".")[0].lower()


@dataclass
class Config:
    server: str
    target_dir: str
    state_dir: str
    token: str | None = None
    enrollment_token: str | None = None
    name: str = field(default_factory=host_name)
    # Whether --name was given (else the name kept at enrollment wins over the host's).
    name_given: bool = False
    # Every --server URL, in order of preference; `server` is the first.
    servers: list = field(default_factory=list)
    # No --state-dir, and an older agent's default one was found and is used.
    legacy_state_dir: bool = False
    labels: dict = field(default_factory=dict)
    validate_command: str | None = None
    reload_command: str | None = None
    start_command: str | None = None
    command_timeout: float = 120.0
    poll_interval: float | None = None
    ca_bundle: str | None = None
    log_level: str = "INFO"
    once: bool = False
    token_file: str | None = None
    secret_allow: list | None = None
    command_env: tuple = ()
    health_command: str | None = None
    health_url: str | None = None
    health_timeout: float = 10.0
    health_retries: int = 3
    health_interval: float = 2.0


# name, help; each is a flag (--target-dir), a variable (BELLWETHER_TARGET_DIR)
# and a key of the [agent] section of the config file (target_dir).
OPTIONS = [
    ("server", "Base URL of the Bellwether server, e.g. https://bellwether.example.com. "
               "Several, separated by commas or with --server again: the agent fails over "
               "to the next on no answer or a 5xx and goes back to the first when it "
               "answers again."),
    ("token", "This agent's token (bwa_...). Once enrolled, the token is kept in the "
              "state directory and this is not needed."),
    ("token_file", "A file holding this agent's token (keeps it off the command line; "
                   "BELLWETHER_TOKEN is the other way)."),
    ("enrollment_token", "An enrollment token (bwe_...) to exchange for an agent token on "
                         "first start."),
    ("name", "Agent name when enrolling (default: the host name)."),
    ("labels", "Labels when enrolling, as key=value pairs separated by commas."),
    ("target_dir", "Directory the snapshot's files are written to."),
    ("state_dir", "Directory for identity.json (the token), state.json and backups "
                  f"(default: {STATE_ROOT}/<name>)."),
    ("validate_command", "Checks the new files; non-zero exit rejects the snapshot. "
                         "Naming {staged} (e.g. 'nginx -t -p {staged}/'), it checks the "
                         "snapshot staged beside the live files before they are swapped "
                         "in; otherwise the files are written in place first "
                         "(e.g. 'nginx -t'). Commands run in <state-dir>/run with a "
                         "scrubbed environment (docs/agents.md); give absolute paths."),
    ("reload_command", "Run after a successful validation (e.g. 'nginx -s reload')."),
    ("start_command", "Run when reload fails, to start the service (e.g. 'nginx')."),
    ("command_timeout", "Seconds before validate/reload/start commands are killed "
                        "(default 120)."),
    ("command_env", "Names of further environment variables commands get, separated by "
                    "commas."),
    ("health_command", "Probes the service after each reload; non-zero exit means "
                       "unhealthy (e.g. 'curl -fsS http://127.0.0.1/healthz'). It runs like "
                       "the other commands. An unhealthy service gets the previous files "
                       "back (reloaded) and the snapshot is reported failed for its "
                       "rollout wave."),
    ("health_url", "An http(s) URL probed after each reload: it must answer 2xx (no "
                   "redirect followed, no proxy). With --health-command too, both must "
                   "pass."),
    ("health_timeout", "Seconds before one health attempt is abandoned (default 10)."),
    ("health_retries", "Attempts before the service counts as unhealthy (default 3)."),
    ("health_interval", "Seconds between health attempts (default 2)."),
    ("secret_allow", "The secret references this host resolves, as prefixes ending in "
                     "'/' or globs, separated by commas, e.g. 'env:SHOP_*,file:/etc/shop/' "
                     "(default: every env: and file: reference)."),
    ("poll_interval", "Seconds between polls; overrides the server's interval."),
    ("ca_bundle", "CA bundle file for verifying the server's TLS certificate."),
    ("log_level", "DEBUG, INFO, WARNING or ERROR (default INFO)."),
]


class ConfigError(Exception):
    pass


def parse_labels(text) -> dict:
    if isinstance(text, dict):
        return text
    labels = {}
    for pair in filter(None, (p.strip() for p in (text or "").split(","))):
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"labels: {pair!r} is not key=value")
        labels[key.strip()] = value.strip()
    return labels


def _list(text) -> list:
    if isinstance(text, (list, tuple)):
        return list(text)
    return [p.strip() for p in (text or "").split(",") if p.strip()]


def _check_apart(target: str, state: str) -> None:
    """Snapshot files must never reach the state directory (token, backups)."""
    real_target, real_state = os.path.realpath(target), os.path.realpath(state)
    if os.path.commonpath([real_target, real_state]) in (real_target, real_state):
        raise ConfigError("--state-dir and --target-dir must not be inside one another")


def _token_from(values: dict):
    """--token, else the content of --token-file."""
    if values.get("token") or not values.get("token_file"):
        return values.get("token") or None
    try:
        with open(values["token_file"], encoding="utf-8") as handle:
            token = handle.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read --token-file {values['token_file']}: {exc}") from None
    if not token:
        raise ConfigError(f"--token-file {values['token_file']} is empty")
    return token


# The server's token prefixes (apps/fleet/enrollment.py, apps/tenancy/authentication.py):
# the agent is a package of its own and cannot import them.
AGENT_TOKEN_PREFIX, ENROLLMENT_TOKEN_PREFIX, USER_TOKEN_PREFIX = "bwa_", "bwe_", "bwu_"
CREATE_ENROLLMENT_TOKEN = ("create one with `manage.py enrollment_token create <app>/<env>` "
                           "(or POST /api/v1/environments/<app>/<env>/enrollment-tokens)")


def _check_token_kinds(values: dict, *, where: str) -> None:
    """A token of the wrong kind (by its prefix) exits 2 before anything is sent,
    saying what it is: the server could only answer that it does not know it."""
    token, enrollment = values.get("token") or "", values.get("enrollment_token") or ""
    if token.startswith(ENROLLMENT_TOKEN_PREFIX):
        raise ConfigError(f"{where} holds an enrollment token ({ENROLLMENT_TOKEN_PREFIX}…), "
                          "not an agent token: give it with --enrollment-token (or "
                          "BELLWETHER_ENROLLMENT_TOKEN) to enroll")
    if token.startswith(USER_TOKEN_PREFIX):
        raise ConfigError(f"{where} holds an API token ({USER_TOKEN_PREFIX}…), not an agent "
                          "token: an agent gets its token by enrolling with an enrollment "
                          f"token; {CREATE_ENROLLMENT_TOKEN}")
    if enrollment.startswith(USER_TOKEN_PREFIX):
        raise ConfigError(f"--enrollment-token is an API token ({USER_TOKEN_PREFIX}…), not an "
                          f"enrollment token ({ENROLLMENT_TOKEN_PREFIX}…); "
                          f"{CREATE_ENROLLMENT_TOKEN}")
    if enrollment.startswith(AGENT_TOKEN_PREFIX):
        raise ConfigError(f"--enrollment-token is an agent token ({AGENT_TOKEN_PREFIX}…), not "
                          f"an enrollment token ({ENROLLMENT_TOKEN_PREFIX}…): give it with "
                          "--token, --token-file or BELLWETHER_TOKEN")


def program_name() -> str:
    """How the agent was invoked: `bellwether-agent` (the installed command) or
    `python -m agent`."""
    invoked = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if not invoked or invoked in ("__main__.py", "-c", "-m"):
        return "python -m agent"
    return invoked


def _health(values: dict) -> None:
    """Check and convert the --health-* options in `values` (in place)."""
    for name in ("health_command", "health_url"):
        values[name] = (values.get(name) or "").strip() or None
    url = values["health_url"]
    if url is not None:
        try:
            parsed = urllib.parse.urlsplit(url)
            host = parsed.hostname
        except ValueError:  # e.g. an unclosed IPv6 bracket
            parsed, host = None, None
        if host is None or parsed.scheme not in ("http", "https") or any(
                ord(c) < 33 or ord(c) == 127 for c in url):
            raise ConfigError(f"--health-url {url!r} is not a URL: give http:// or https:// "
                              "and a host, e.g. http://127.0.0.1:8080/healthz")
    for name, default in (("health_timeout", 10.0), ("health_interval", 2.0)):
        raw = values.get(name)
        try:
            value = default if raw in (None, "") else float(raw)
        except ValueError:
            value = None
        low_ok = value is not None and (value > 0 if name == "health_timeout" else value >= 0)
        if not (low_ok and math.isfinite(value)):
            least = "positive" if name == "health_timeout" else "non-negative"
            raise ConfigError(f"--{name.replace('_', '-')} must be a {least} number of "
                              f"seconds, not {raw!r}")
        values[name] = value
    raw = values.get("health_retries")
    try:
        retries = 3 if raw in (None, "") else int(str(raw).strip())
    except ValueError:
        retries = 0
    if not 1 <= retries <= 100:
        raise ConfigError(f"--health-retries must be a whole number of attempts from 1 to "
                          f"100, not {raw!r}")
    values["health_retries"] = retries


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=program_name(),
        description=(
            "Bellwether agent: polls the server for this host's desired snapshot "
            "(conditional GET with ETags), applies it safely (atomic writes, validate, "
            "reload, restore on failure, safe fallback) and reports the result. Every "
            "option can also come from an environment variable BELLWETHER_<OPTION> or "
            "from the [agent] section of --config; flags win over variables, variables "
            "over the file."
        ),
        epilog=(
            "Exit codes: 0 in sync or applied; 1 the snapshot failed (restored or fallback); "
            "2 bad configuration (a token of the wrong kind included, or enrollment "
            "refused, or another agent holds the state directory); 3 the server refused "
            "the token; with --once: 4 the server is unreachable or failing, 5 an "
            "unexpected error, 6 the desired snapshot is blocked (it failed here; a new "
            "snapshot or a push of it retries), 7 no snapshot is desired yet; 130, 143 "
            "stopped by SIGINT, SIGTERM (the running command's process group is ended too). "
            "Secrets: only the placeholders the bundle's secrets manifest lists are "
            "resolved (env:NAME and file:/path references), within --secret-allow."
        ),
    )
    parser.add_argument("--config", help="INI file with an [agent] section "
                                         "(variable BELLWETHER_CONFIG).")
    for name, help_text in OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, help=help_text,
                            action="append" if name == "server" else "store")
    parser.add_argument("--once", action="store_true",
                        help="Poll and apply once, then exit (for cron and scripts).")
    return parser


def load(argv=None, environ=None) -> Config:
    environ = os.environ if environ is None else environ
    args = build_parser().parse_args(argv)
    values = {}
    config_file = args.config or environ.get(f"{ENV_PREFIX}CONFIG")
    if config_file:
        parser = configparser.ConfigParser(interpolation=None)
        try:
            if not parser.read(config_file):
                raise ConfigError(f"cannot read config file {config_file}")
        except configparser.Error as exc:
            raise ConfigError(f"--config {config_file}: {exc}") from None
        if not parser.has_section("agent"):
            raise ConfigError(f"--config {config_file} has no [agent] section "
                              f"(sections: {', '.join(parser.sections()) or 'none'})")
        values.update(parser.items("agent"))
    for name, _ in OPTIONS:
        if f"{ENV_PREFIX}{name.upper()}" in environ:
            values[name] = environ[f"{ENV_PREFIX}{name.upper()}"]
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    name_given = bool(values.get("name"))
    unknown = set(values) - {name for name, _ in OPTIONS}
    if unknown:
        raise ConfigError(f"unknown option(s) in {config_file}: {', '.join(sorted(unknown))}")
    values["servers"] = _servers(values.get("server"))
    values["server"] = values["servers"][0] if values["servers"] else None
    for required in ("server", "target_dir"):
        if not values.get(required):
            raise ConfigError(f"--{required.replace('_', '-')} is required")
    values["target_dir"] = os.path.abspath(values["target_dir"])
    if not values.get("name"):
        values.pop("name", None)
    if values.get("state_dir"):
        values["state_dir"] = os.path.abspath(values["state_dir"])
    else:
        values["state_dir"], values["legacy_state_dir"] = _default_state_dir(
            values["target_dir"], values.get("name") or host_name())
    values["labels"] = parse_labels(values.get("labels"))
    _check_apart(values["target_dir"], values["state_dir"])
    token_source = "--token (or BELLWETHER_TOKEN)" if values.get("token") else "--token-file"
    values["token"] = _token_from(values)
    _check_token_kinds(values, where=token_source)
    values["secret_allow"] = _list(values.get("secret_allow")) or None
    values["command_env"] = tuple(_list(values.get("command_env")))
    _health(values)
    for number in ("command_timeout", "poll_interval"):
        if values.get(number) in (None, ""):
            values.pop(number, None)
            continue
        try:
            values[number] = float(values[number])
        except ValueError:
            raise ConfigError(f"--{number.replace('_', '-')} must be a number of seconds, "
                              f"not {values[number]!r}") from None
        if not 0 < values[number] < float("inf"):
            raise ConfigError(f"--{number.replace('_', '-')} must be a positive number of "
                              f"seconds, not {values[number]!r}")
    level = str(values.get("log_level", "INFO")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {level!r}")
    values["log_level"] = level
    if values.get("poll_interval") is not None and values["poll_interval"] < 1:
        raise ConfigError("--poll-interval must be at least 1 second")
    return Config(once=args.once, name_given=name_given, **values)


def _default_state_dir(target: str, name: str) -> tuple:
    """STATE_ROOT/<name>; an older agent's default (next to the target) while it
    holds a state and the new one does not exist yet."""
    default = os.path.join(STATE_ROOT, name)
    legacy = os.path.join(os.path.dirname(target), ".bellwether-state")
    if not os.path.exists(default) and os.path.isfile(os.path.join(legacy, "state.json")):
        return legacy, True
    return default, False


def _servers(raw) -> list:
    """The --server URLs: repeated flags and/or comma-separated, each http(s)://host."""
    parts = raw if isinstance(raw, list) else [raw or ""]
    urls = [u.strip() for part in parts for u in part.split(",") if u.strip()]
    for url in urls:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"--server {url!r} is not a URL: give http:// or https:// and "
                              "a host, e.g. https://bellwether.example.com")
    return urls


def _usable_directory(option: str, path: str, *, writable: bool) -> None:
    """Made if absent: the state directory 0700, the target 0755, the directories
    above either 0755, whatever the umask."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{option} {path} is not a directory")
    try:
        make_directories(path, 0o700 if option == "--state-dir" else 0o755,
                         parents_mode=0o755)
    except OSError as exc:
        raise ConfigError(f"{option} {path} cannot be created: {exc.strerror}") from None
    if writable and not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path} is not writable by this agent")


def check_directories(config: Config) -> None:
    """Before anything else (enrolling included): the target directory is a
    directory (made if absent); the state directory one this agent can write."""
    _usable_directory("--target-dir", config.target_dir, writable=False)
    _usable_directory("--state-dir", config.state_dir, writable=True)
    # An empty file: checks permission and a read-only mount, not free space (a
    # full state directory is a fault the agent reports, not a configuration error).
    probe = os.path.join(config.state_dir, f".write-probe-{os.getpid()}")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(f"--state-dir {config.state_dir} is not writable: "
                          f"{exc.strerror}") from None
