"""Websockets open only from a page of this very origin.

Channels' AllowedHostsOriginValidator compares the Origin's host name with
ALLOWED_HOSTS and ignores scheme and port, so a page served by anything else on
the same host (http://localhost:9999) could open the live socket with the
user's session cookie. Here the Origin must equal the origin the browser asked
for — scheme, host and port — as the Host header and the connection say it
(the scheme from X-Forwarded-Proto only when BELLWETHER_PROXY_COUNT trusts a
proxy to set it); AllowedHostsOriginValidator still checks the host.
"""

from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings

DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin(scheme: str, netloc: str) -> tuple | None:
    """(scheme, host, port) of `scheme://netloc`, or None when it is not one."""
    try:
        parts = urlsplit(f"{scheme}://{netloc}")
        port = parts.port or DEFAULT_PORTS.get(scheme)
    except ValueError:
        return None
    if not parts.hostname or parts.path or parts.query or parts.username is not None:
        return None
    return scheme, parts.hostname.lower(), port


def same_origin(headers: dict, *, secure: bool, proxy_count: int) -> bool:
    """Whether a websocket handshake's Origin is the origin its Host names.
    `headers`: lower-case names to the (last) value, as text; `secure`: wss."""
    origin, host = headers.get("origin"), headers.get("host")
    if not origin or not host:
        return False
    forwarded = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    https = secure or (proxy_count > 0 and forwarded == "https")
    declared = urlsplit(origin)
    if declared.scheme not in DEFAULT_PORTS or declared.path or declared.query \
            or declared.fragment:
        return False  # also "null", the origin of sandboxed and file pages
    expected = _origin("https" if https else "http", host)
    return expected is not None and _origin(declared.scheme, declared.netloc) == expected


class SameOriginWebsockets:
    """ASGI middleware refusing a websocket handshake from another origin."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            headers = {name.decode("latin-1").lower(): value.decode("latin-1")
                       for name, value in scope.get("headers", [])}
            if not same_origin(headers, secure=scope.get("scheme") == "wss",
                               proxy_count=settings.BELLWETHER_PROXY_COUNT):
                return await WebsocketDenier()(scope, receive, send)
        return await self.app(scope, receive, send)
