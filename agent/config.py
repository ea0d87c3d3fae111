"""Agent configuration: flags over environment variables over a config file."""

from __future__ import annotations

import argparse
import configparser
import os
import socket
from dataclasses import dataclass, field

ENV_PREFIX = "BELLWETHER_"


@dataclass
class Config:
    server: str
    target_dir: str
    state_dir: str
    token: str | None = None
    enrollment_token: str | None = None
    name: str = field(default_factory=lambda: socket.gethostname().split(".")[0].lower())
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


# name, help; each is a flag (--target-dir), a variable (BELLWETHER_TARGET_DIR)
# and a key of the [agent] section of the config file (target_dir).
OPTIONS = [
    ("server", "Base URL of the Bellwether server, e.g. https://bellwether.example.com."),
    ("token", "This agent's token (bwa_...). Once enrolled, the token is kept in the "
              "state directory and this is not needed."),
    ("token_file", "A file holding this agent's token (keeps it off the command line; "
                   "BELLWETHER_TOKEN is the other way)."),
    ("enrollment_token", "An enrollment token (bwe_...) to exchange for an agent token on "
                         "first start."),
    ("name", "Agent name when enrolling (default: the host name)."),
    ("labels", "Labels when enrolling, as key=value pairs separated by commas."),
    ("target_dir", "Directory the snapshot's files are written to."),
    ("state_dir", "Directory for state.json, the token and backups (default: "
                  "<target_dir>/../.bellwether-state)."),
    ("validate_command", "Run after writing files; non-zero exit rejects the snapshot "
                         "(e.g. 'nginx -t'). Commands run in <state-dir>/run with a "
                         "scrubbed environment (docs/agents.md); give absolute paths."),
    ("reload_command", "Run after a successful validation (e.g. 'nginx -s reload')."),
    ("start_command", "Run when reload fails, to start the service (e.g. 'nginx')."),
    ("command_timeout", "Seconds before validate/reload/start commands are killed "
                        "(default 120)."),
    ("command_env", "Names of further environment variables commands get, separated by "
                    "commas."),
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m agent",
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
            "2 bad configuration (or enrollment refused); 3 the server refused the token; 4 "
            "the server is unreachable or failing (with --once); 5 an unexpected error. "
            "Secrets: only the placeholders the bundle's secrets manifest lists are "
            "resolved (env:NAME and file:/path references), within --secret-allow."
        ),
    )
    parser.add_argument("--config", help="INI file with an [agent] section "
                                         "(variable BELLWETHER_CONFIG).")
    for name, help_text in OPTIONS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, help=help_text)
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
        if not parser.read(config_file):
            raise ConfigError(f"cannot read config file {config_file}")
        if parser.has_section("agent"):
            values.update(parser.items("agent"))
    for name, _ in OPTIONS:
        if f"{ENV_PREFIX}{name.upper()}" in environ:
            values[name] = environ[f"{ENV_PREFIX}{name.upper()}"]
        if getattr(args, name) is not None:
            values[name] = getattr(args, name)
    unknown = set(values) - {name for name, _ in OPTIONS}
    if unknown:
        raise ConfigError(f"unknown option(s) in {config_file}: {', '.join(sorted(unknown))}")
    for required in ("server", "target_dir"):
        if not values.get(required):
            raise ConfigError(f"--{required.replace('_', '-')} is required")
    target = os.path.abspath(values["target_dir"])
    values["target_dir"] = target
    values["state_dir"] = os.path.abspath(
        values.get("state_dir") or os.path.join(os.path.dirname(target), ".bellwether-state"))
    values["labels"] = parse_labels(values.get("labels"))
    _check_apart(values["target_dir"], values["state_dir"])
    values["token"] = _token_from(values)
    values["secret_allow"] = _list(values.get("secret_allow")) or None
    values["command_env"] = tuple(_list(values.get("command_env")))
    try:
        for number in ("command_timeout", "poll_interval"):
            if values.get(number) not in (None, ""):
                values[number] = float(values[number])
            else:
                values.pop(number, None)
    except ValueError as exc:
        raise ConfigError(f"not a number: {exc}") from None
    level = str(values.get("log_level", "INFO")).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise ConfigError(f"--log-level must be DEBUG, INFO, WARNING or ERROR, not {level!r}")
    values["log_level"] = level
    if values.get("poll_interval") is not None and values["poll_interval"] < 1:
        raise ConfigError("--poll-interval must be at least 1 second")
    return Config(once=args.once, **values)
