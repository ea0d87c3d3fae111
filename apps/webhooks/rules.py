"""The rules of webhooks, pure: what an endpoint may name (events, URL, addresses),
the body and signature of a delivery, and when a failed attempt is tried again."""

import hashlib
import hmac
import ipaddress
import json
import re
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


# --- where an endpoint may point ---------------------------------------------------------

# A DNS label: letters, digits, hyphens (and the underscores some names carry).
_LABEL = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?")
# A label that makes a host an IPv4 address in URL parsers and resolvers (WHATWG
# "ends in a number"): decimal, octal (0…) or hexadecimal (0x…).
_NUMBER = re.compile(r"[0-9]+|0x[0-9a-f]*")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address in the last 32 bits
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: local use, never global
_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated IPv4-compatible (RFC 4291)
# Tunnels whose addresses are refused whatever IPv4 address they carry.
_NEVER_CARRIED = ("Teredo", "IPv4-compatible")
REFUSED_UNLESS_ALLOWED = ("private or loopback addresses are refused unless "
                          "BELLWETHER_WEBHOOK_ALLOW_PRIVATE allows them")


def _carried_ipv4(ip: ipaddress.IPv6Address) -> tuple[str, ipaddress.IPv4Address] | None:
    """The IPv4 address an IPv6 address carries and how (a packet to it reaches that
    IPv4 host), or None."""
    if ip.ipv4_mapped:
        return "IPv4-mapped", ip.ipv4_mapped
    if ip in _NAT64:
        return "NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.sixtofour:
        return "6to4", ip.sixtofour
    if ip.teredo:
        return "Teredo", ip.teredo[1]
    if ip in _COMPATIBLE and int(ip) > 1:
        return "IPv4-compatible", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _scope_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """What kind of not-public address `ip` is, or None (ipaddress's own properties;
    multicast and site-local checked too: Python counts some of them global)."""
    for what, applies in (("unspecified", ip.is_unspecified), ("loopback", ip.is_loopback),
                          ("link-local (cloud metadata lives there)", ip.is_link_local),
                          ("multicast", ip.is_multicast),
                          ("site-local", getattr(ip, "is_site_local", False)),
                          ("private", ip.is_private), ("reserved", ip.is_reserved),
                          ("not globally reachable", not ip.is_global)):
        if applies:
            return f"{what} address"
    return None


def address_refusal(address: str) -> str | None:
    """Why a webhook must not reach the IP address `address` (unless private addresses
    are allowed), or None. An IPv6 address that carries an IPv4 one (mapped, NAT64,
    6to4) is judged by the IPv4 address it reaches; Teredo and IPv4-compatible ones,
    local-use NAT64 and every not-global range are refused."""
    try:
        ip = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return "not an IP address"
    if isinstance(ip, ipaddress.IPv6Address):
        carried = _carried_ipv4(ip)
        if carried is not None:
            how, inner = carried
            why = _scope_refusal(inner)
            if why or how in _NEVER_CARRIED:
                return f"{how} form of {inner}, " + (why or "a tunnel never allowed")
            return None
        if ip in _LOCAL_NAT64:
            return "local-use NAT64 address"
    return _scope_refusal(ip)


def address_refused(address: str) -> bool:
    """Whether a webhook must not reach `address` without the setting that allows it."""
    return address_refusal(address) is not None


def _ipv4_spelled(name: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address a host whose last label is a number names, or None when it
    is not four canonical decimal numbers (2130706433, 0x7f.1, 017700000001 and
    127.1 all reach 127.0.0.1 in some resolver: refused whatever they reach)."""
    try:
        return ipaddress.IPv4Address(name)
    except ValueError:
        return None


def host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a URL's host (urlsplit's `hostname`, a trailing dot allowed) is
    written as, or None for a name. Raises ValueError, saying how to write it, for
    an IP address written in any other way."""
    name = (host[:-1] if host.endswith(".") else host).lower()
    if ":" in name:
        try:
            return ipaddress.IPv6Address(name.split("%")[0])
        except ValueError:
            raise ValueError("an IPv6 address in brackets") from None
    if _NUMBER.fullmatch(name.rsplit(".", 1)[-1]):
        ip = _ipv4_spelled(name)
        if ip is None:
            raise ValueError("an IPv4 address written as four decimal numbers 0-255 "
                             "without leading zeros")
        return ip
    return None


def _host_problem(host: str, allow_private: bool) -> str | None:
    try:
        ip = host_address(host)
    except ValueError as exc:
        return str(exc)
    if ip is not None:
        why = None if allow_private else address_refusal(str(ip))
        return f"{ip}: {why}; {REFUSED_UNLESS_ALLOWED}" if why else None
    name = host[:-1] if host.endswith(".") else host
    if len(name) > 253 or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        return "a host name of letters, digits, hyphens and dots (IDN names as xn--)"
    if allow_private or not (name == "localhost" or name.endswith(".localhost")):
        return None
    return f"a loopback host; {REFUSED_UNLESS_ALLOWED}"


def _bad_character(url: str) -> str | None:
    for at, char in enumerate(url):
        if not "!" <= char <= "~":
            return f"{char!r} at {at}"
    return None


def url_problem(url: str, *, allow_private: bool) -> str | None:
    """Why `url` cannot be an endpoint, or None: printable ASCII (no whitespace or
    control character anywhere: percent-encode), http(s), a port 1-65535, no
    credentials, a well-formed host and (unless allowed) no private, loopback or
    otherwise not-public address written as such. Names are resolved elsewhere
    (apps.webhooks.transport)."""
    if not isinstance(url, str) or len(url) > MAX_URL:
        return f"a URL of at most {MAX_URL} characters"
    bad = _bad_character(url)
    if bad:
        return f"printable ASCII without spaces or control characters (found {bad})"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "an http:// or https:// URL with a host"
    if "@" in parts.netloc:
        return "no user or password in the URL"
    if "[" in parts.netloc and ":" not in parts.hostname:
        return "an IPv6 address in brackets"
    if port == 0:
        return "a port from 1 to 65535"
    return _host_problem(parts.hostname, allow_private)


def url_shown(url: str) -> str:
    """The URL as the audit log shows it: scheme, host and port only. Its path, query
    and credentials may hold the receiver's secrets (a token in the path, a key in
    the query), which only the environment's owners see."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        host = port = None
    if not host or _bad_character(url) or not parts.scheme.isalpha():
        return "(a URL that does not parse)"
    shown = f"{parts.scheme}://{f'[{host}]' if ':' in host else host}"
    shown += f":{port}" if port else ""
    return shown + ("/…" if parts.path.strip("/") or parts.query or parts.fragment else "/")
