"""Where the CLI finds its server and token: flags, then the environment
(BELLWETHER_URL, BELLWETHER_TOKEN, BELLWETHER_PROFILE, BELLWETHER_CONFIG), then a
profile of the config file. The token is never printed, only where it came from; a
file holding it that others may read is warned about (as ssh does), not refused."""

from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from cli.errors import UsageError

PROFILE_KEYS = {"url", "token", "token_file", "timeout_s"}
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Profile:
    url: str
    token: str
    name: str
    token_source: str  # "BELLWETHER_TOKEN", or "profile NAME of FILE"
    timeout_s: float = DEFAULT_TIMEOUT_S
    warnings: tuple[str, ...] = ()  # shown once on stderr

    def __repr__(self) -> str:  # never the token, even in a traceback
        return f"Profile(url={self.url!r}, name={self.name!r}, token_source={self.token_source!r})"


def default_config_path(environ) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "bellwether" / "config.toml"


def config_file_for(option: str | None, environ) -> tuple[Path, bool]:
    """(path, whether it must exist): --config or BELLWETHER_CONFIG must; the default
    location may be absent."""
    named = option or environ.get("BELLWETHER_CONFIG")
    if named:
        return Path(named).expanduser(), True
    return default_config_path(environ), False


def read_config_file(path: Path, required: bool) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        if required:
            raise UsageError(f"config file {path} does not exist") from None
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"config file {path} cannot be read: {exc}") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"config file {path} is not valid TOML: {exc}") from None


def profile_section(config: dict, name: str, path: Path, chosen: bool) -> dict:
    profiles = config.get("profiles", {})
    if not isinstance(profiles, dict):
        raise UsageError(f"config file {path}: [profiles] must be a table of profiles")
    section = profiles.get(name)
    if section is None:
        if chosen:
            known = ", ".join(sorted(profiles)) or "none"
            raise UsageError(f"config file {path} has no profile {name!r} (profiles: {known})")
        return {}
    if not isinstance(section, dict):
        raise UsageError(f"config file {path}: profiles.{name} must be a table")
    unknown = sorted(set(section) - PROFILE_KEYS)
    if unknown:
        raise UsageError(f"config file {path}: profiles.{name} has unknown key(s) "
                         f"{', '.join(unknown)} (known: {', '.join(sorted(PROFILE_KEYS))})")
    return section


def redacted_url(url: str) -> str:
    """The URL as it may be shown: a user and password in it become ***."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "(an invalid URL)"
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rpartition("@")[2]))


def checked_url(url: str, where: str) -> str:
    try:
        parts = urlsplit(url.strip())
    except ValueError:
        parts = urlsplit("")
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"{where}: {redacted_url(url)!r} is not a server URL (give http:// "
                         "or https:// and a host, e.g. https://bellwether.example.com)")
    if "@" in parts.netloc:
        raise UsageError(f"{where}: {redacted_url(url.strip())!r} holds a user or password, "
                         "which the CLI never sends: give the URL without them and the "
                         "token in BELLWETHER_TOKEN or the profile")
    return url.strip().rstrip("/")


def checked_token(token: str, where: str) -> str:
    token = token.strip()
    if not token:
        raise UsageError(f"{where}: the token is empty")
    if any(ord(c) < 33 or ord(c) == 127 for c in token):
        raise UsageError(f"{where}: the token holds spaces or control characters "
                         "(it is not shown)")
    return token


def token_from_profile(section: dict, name: str,
                       path: Path) -> tuple[str | None, str, Path | None]:
    """(the token, where it came from, the file holding it)."""
    where = f"profile {name} of {path}"
    if "token" in section and "token_file" in section:
        raise UsageError(f"{where}: give token or token_file, not both")
    if "token_file" in section:
        token_path = Path(str(section["token_file"])).expanduser()
        try:
            return (token_path.read_text(encoding="utf-8"),
                    f"{where} (token_file {token_path})", token_path)
        except OSError as exc:
            raise UsageError(f"{where}: token_file {token_path} cannot be read: "
                             f"{exc.strerror}") from None
    if "token" in section:
        return str(section["token"]), where, path
    return None, where, None


def token_file_exposure(path: Path | None) -> tuple[str, ...]:
    """A warning when the file holding the token may be read by its group or by
    anyone (ssh's rule for a private key); nothing on a system without modes."""
    if path is None or os.name != "posix":
        return ()
    try:
        mode = path.stat().st_mode & 0o777
    except OSError:
        return ()
    if not mode & 0o044:
        return ()
    return (f"{path} holds a token and others may read it (mode {mode:04o}): "
            f"chmod 600 {path}",)


def timeout_from(section: dict, name: str, path: Path) -> float:
    value = section.get("timeout_s", DEFAULT_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 1 <= value <= 600:
        raise UsageError(f"profile {name} of {path}: timeout_s must be a number of seconds "
                         "from 1 to 600")
    return float(value)


def profile_load(*, config_option: str | None, profile_option: str | None,
                 url_option: str | None, environ) -> Profile:
    """The server and token to use, or a UsageError saying what is missing and where
    to put it."""
    path, required = config_file_for(config_option, environ)
    config = read_config_file(path, required)
    chosen = profile_option or environ.get("BELLWETHER_PROFILE")
    name = chosen or config.get("default_profile") or "default"
    section = profile_section(config, str(name), path, bool(chosen))
    url = url_option or environ.get("BELLWETHER_URL") or section.get("url")
    if not url:
        raise UsageError("no server: set BELLWETHER_URL, pass --url, or give url in profile "
                         f"{name} of {path}")
    if environ.get("BELLWETHER_TOKEN"):
        token, source, holder = environ["BELLWETHER_TOKEN"], "BELLWETHER_TOKEN", None
    else:
        token, source, holder = token_from_profile(section, str(name), path)
    if token is None:
        raise UsageError("no token: set BELLWETHER_TOKEN, or give token (or token_file) in "
                         f"profile {name} of {path}; create one with "
                         "`manage.py api_token create USERNAME` or in the admin")
    return Profile(url=checked_url(str(url), "server URL"), token=checked_token(token, source),
                   name=str(name), token_source=source,
                   timeout_s=timeout_from(section, str(name), path),
                   warnings=token_file_exposure(holder))


def token_hint(token: str) -> str:
    """What may be shown of a token: its public key part (bwu_<key>), never the secret."""
    key = token.split(".", 1)[0]
    return f"{key}.…" if key != token and len(key) < 40 else "(set)"



