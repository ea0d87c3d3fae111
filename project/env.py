"""Strict readers of environment variables, for project/settings.py.

Each reader takes the variable's name and its default. An unset variable, or one
set to an empty (or blank) value, gives the default: `DATABASE_URL= make run`
means "no DATABASE_URL". Any other value must parse, or the reader raises
ImproperlyConfigured naming the variable and the value, so a typo stops the
process at start-up instead of quietly meaning something else.

Small helpers rather than django-environ: its bool cast maps any unknown string
to False and its int cast lets a bare ValueError out, the two things these
readers exist to refuse.
"""

import ipaddress
import os
import re
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

TRUE = frozenset({"true", "1", "yes", "on"})
FALSE = frozenset({"false", "0", "no", "off"})
_INTEGER = re.compile(r"-?[0-9]+")
_URL_PASSWORD = re.compile(r"(://[^/@:]*:).*@")


def _value(name: str) -> str | None:
    """The variable's value with surrounding blanks removed; None when unset or blank."""
    value = os.environ.get(name, "").strip()
    return value or None


def redact(value: str) -> str:
    """`value` with the password of a scheme://user:password@host URL hidden (up to
    the last @, so an unquoted @ in the password hides the rest too)."""
    return _URL_PASSWORD.sub(r"\1***@", value)


def invalid(name: str, value: str, reason: str) -> ImproperlyConfigured:
    return ImproperlyConfigured(f"{name}={redact(value)!r} is not valid: {reason}.")


def env_str(name: str, default: str = "") -> str:
    value = _value(name)
    return default if value is None else value


def env_path(name: str, default: Path) -> Path:
    value = _value(name)
    return default if value is None else Path(value)


def env_bool(name: str, default: bool) -> bool:
    """true/false, 1/0, yes/no or on/off, in any case; anything else raises."""
    value = _value(name)
    if value is None:
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise invalid(name, value, "expected true/false, 1/0, yes/no or on/off")


def env_int(name: str, default: int, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
    """Decimal digits (with an optional minus sign), at least `minimum` and at most
    `maximum` when given."""
    value = _value(name)
    if value is None:
        return default
    if not _INTEGER.fullmatch(value):
        raise invalid(name, value, "expected a whole number")
    number = int(value)
    if maximum is not None and minimum is not None and not minimum <= number <= maximum:
        raise invalid(name, value,
                      f"expected a whole number of at least {minimum} and at most {maximum}")
    if minimum is not None and number < minimum:
        raise invalid(name, value, f"expected a whole number of at least {minimum}")
    if maximum is not None and number > maximum:
        raise invalid(name, value, f"expected a whole number of at most {maximum}")
    return number


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, in any case; returned as spelled in `choices`."""
    value = _value(name)
    if value is None:
        return default
    for choice in choices:
        if value.lower() == choice.lower():
            return choice
    raise invalid(name, value, "expected one of " + ", ".join(choices))


def env_list(name: str, default: list[str], *, item: re.Pattern | None = None,
             expected: str = "") -> list[str]:
    """Comma-separated items, blanks around them and empty items dropped; each must
    match the pattern `item` when given (`expected` says what it should look like)."""
    value = _value(name)
    if value is None:
        return list(default)
    items = [entry.strip() for entry in value.split(",") if entry.strip()]
    for entry in items:
        if item is not None and not item.fullmatch(entry):
            raise invalid(name, value, f"item {redact(entry)!r}: expected {expected}")
    return items


def env_networks(name: str, default: list[str]) -> list:
    """Comma-separated networks in CIDR notation (an address alone is one host)."""
    networks = []
    for entry in env_list(name, default):
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as exc:
            raise invalid(name, _value(name) or "", f"item {redact(entry)!r}: {exc}") from None
    return networks


def env_url(name: str, default: str, *, schemes: tuple[str, ...]) -> str:
    """A URL whose scheme is one of `schemes` (an empty default means "not set")."""
    value = _value(name)
    if value is None:
        return default
    scheme, separator, rest = value.partition("://")
    if not separator or scheme.lower() not in schemes or not rest:
        raise invalid(name, value, "expected a URL starting with "
                      + " or ".join(f"{s}://" for s in schemes))
    return value


def env_secret(name: str) -> str | None:
    """The variable exactly as set (a secret is not stripped); None when unset or blank."""
    value = os.environ.get(name, "")
    return value if value.strip() else None


_RATE = re.compile(r"([0-9]+)/(second|minute|hour|day)", re.IGNORECASE)


def env_rate(name: str, default: str) -> str | None:
    """A request rate as `N/second`, `N/minute`, `N/hour` or `N/day` (N at least 1),
    or `off` for none (None); returned in the shape DRF's throttles read."""
    value = _value(name)
    if value is None:
        return default
    if value.lower() == "off":
        return None
    match = _RATE.fullmatch(value)
    if match is None or int(match.group(1)) < 1:
        raise invalid(name, value, "expected N/second, N/minute, N/hour or N/day "
                      "(N at least 1), or off")
    return f"{int(match.group(1))}/{match.group(2).lower()}"


# Django's own test of a strong key (the deploy check security.W009): long enough,
# varied enough, and not the prefix `startproject` writes.
SECRET_KEY_MIN_LENGTH = 50
SECRET_KEY_MIN_UNIQUE_CHARACTERS = 5


def weak_secret_key_reason(key: str) -> str | None:
    """Why `key` is too weak to sign production sessions, or None when it is strong."""
    if key.startswith("django-insecure"):
        return "it starts with django-insecure"
    if len(key) < SECRET_KEY_MIN_LENGTH:
        return f"it has {len(key)} characters, fewer than {SECRET_KEY_MIN_LENGTH}"
    if len(set(key)) < SECRET_KEY_MIN_UNIQUE_CHARACTERS:
        return (f"it has {len(set(key))} distinct characters, fewer than "
                f"{SECRET_KEY_MIN_UNIQUE_CHARACTERS}")
    return None
