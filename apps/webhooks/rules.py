"""The rules of webhooks, pure: what an endpoint may name (events, URL, addresses),
the body and signature of a delivery, and when a failed attempt is tried again."""

import hashlib
import hmac
import ipaddress
import json
from urllib.parse import urlsplit

from apps.core.events import DOMAIN_EVENTS

SIGNATURE_HEADER = "X-Bellwether-Signature"
MAX_URL = 2000


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """`sha256=<hex>`: HMAC-SHA256 with the endpoint's secret over
    `<timestamp>.<body>` (the timestamp bounds a replay; docs/webhooks.md)."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def body(*, event: str, sequence: int, environment: str, occurred_at: str,
         data: dict) -> str:
    """The JSON every attempt of a delivery sends, compact and key-ordered."""
    return json.dumps({"event": event, "sequence": sequence, "environment": environment,
                       "occurred_at": occurred_at, "data": data},
                      sort_keys=True, separators=(",", ":"), default=str)


def backoff_s(attempts: int, *, base_s: float, most_s: float) -> float:
    """Seconds before the attempt after `attempts` failed ones: base, 2 x base, 4 x
    base, ... at most `most_s`."""
    return min(most_s, base_s * 2 ** max(0, attempts - 1))


def events_problem(events) -> str | None:
    """Why `events` is not a non-empty list of known domain events, or None."""
    if not isinstance(events, list) or not events:
        return "a non-empty list of event names"
    unknown = [e for e in events if e not in DOMAIN_EVENTS]
    if unknown:
        return f"unknown event {str(unknown[0])[:64]!r}; known: {', '.join(DOMAIN_EVENTS)}"
    if len(set(events)) != len(events):
        return "each event once"
    return None


def address_refused(address: str) -> bool:
    """Whether an IP address is one a webhook must not reach without the setting
    that allows it: loopback, private, link-local (cloud metadata), multicast,
    reserved or unspecified."""
    ip = ipaddress.ip_address(address.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why `url` cannot be an endpoint, or None: http(s), a host, no credentials, and
    (unless allowed) not a private or loopback address written as such."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        return f"a URL of at most {MAX_URL} characters"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if parts.username is not None or parts.password is not None:
        return "no user or password in the URL"
    if allow_private:
        return None
    host = parts.hostname
    if host == "localhost" or host.endswith(".localhost"):
        return "a loopback host (BELLWETHER_WEBHOOK_ALLOW_PRIVATE allows it)"
    try:
        refused = address_refused(host)
    except ValueError:
        return None  # a name: its addresses are checked at each delivery
    return ("a private or loopback address (BELLWETHER_WEBHOOK_ALLOW_PRIVATE allows it)"
            if refused else None)
