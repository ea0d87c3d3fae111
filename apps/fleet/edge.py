"""The agent poll's 304, answered in front of Django on the event loop.

Django's ASGI handler runs every request through a thread whenever a middleware is
synchronous (WhiteNoise is), which holds a web process to a few hundred polls a
second. `PollEdge` wraps the ASGI application: a GET or HEAD of
/api/v1/agent/desired that Django would answer 304 from the cache — a well-formed
agent token matching its cached poll state, an If-None-Match naming the cached
ETag, no unsettled poll debt for the token (apps.fleet.polldebt), an allowed Host,
an address not refused for failed authentications — is answered here with one
cache read, no SQL and no thread. Every other request, and every doubt (a header
sent twice, a precondition Django would evaluate, debts or heartbeats due for
their periodic database work), goes to Django unchanged, which answers as before:
401 with the envelope (counted by FailedAuthenticationMiddleware), 200 with the
body, 429, 400, a redirect to HTTPS.
"""

import time
from types import SimpleNamespace

from django.conf import settings
from django.http.request import split_domain_port, validate_host

from apps.core import throttling, tokens
from apps.fleet import cache, polldebt, rules
from apps.fleet.enrollment import AGENT_TOKEN_PREFIX

DESIRED_PATH = "/api/v1/agent/desired"
# The headers the decision reads; each must come at most once.
_READ = frozenset({b"authorization", b"if-none-match", b"host", b"x-forwarded-for",
                   b"x-forwarded-proto"})
# Preconditions Django evaluates before If-None-Match (412): left to it.
_DJANGO_DECIDES = frozenset({b"if-match", b"if-unmodified-since"})


def _headers(scope) -> dict[bytes, str] | None:
    """The headers the decision reads, or None when one is repeated or a
    precondition only Django evaluates is present."""
    found: dict[bytes, str] = {}
    for name, value in scope.get("headers") or ():
        name = name.lower()
        if name in _DJANGO_DECIDES:
            return None
        if name in _READ:
            if name in found:
                return None
            found[name] = value.decode("latin-1")
    return found


def _host_allowed(host: str | None) -> bool:
    domain, _ = split_domain_port(host or "")
    allowed = settings.ALLOWED_HOSTS
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]  # as HttpRequest.get_host()
    return bool(domain) and validate_host(domain, allowed)


def _is_secure(scope, headers) -> bool:
    if scope.get("scheme") == "https":
        return True
    proxy = settings.SECURE_PROXY_SSL_HEADER
    forwarded = headers.get(b"x-forwarded-proto")
    return bool(proxy and forwarded and forwarded.split(",", 1)[0].strip() == proxy[1])


def _address_refused(scope, headers) -> bool:
    client = scope.get("client")
    meta = {"REMOTE_ADDR": client[0] if client else "",
            "HTTP_X_FORWARDED_FOR": headers.get(b"x-forwarded-for", "")}
    address = throttling.client_ip(SimpleNamespace(META=meta))
    return throttling.blocked_addresses.wait(address, time.time()) is not None


def _presented_token(headers) -> tuple[str, str] | None:
    scheme, _, presented = headers.get(b"authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return tokens.parse(presented.strip(), AGENT_TOKEN_PREFIX)


async def not_modified_etag(scope) -> str | None:
    """The ETag to answer 304 with (the poll's heartbeat recorded), or None when
    Django must answer."""
    if (scope["path"] != DESIRED_PATH or scope["method"] not in ("GET", "HEAD")
            or scope.get("query_string")):
        return None
    headers = _headers(scope)
    if headers is None or b"if-none-match" not in headers:
        return None
    if not _host_allowed(headers.get(b"host")) or _address_refused(scope, headers):
        return None
    if settings.SECURE_SSL_REDIRECT and not _is_secure(scope, headers):
        return None
    parsed = _presented_token(headers)
    if parsed is None:
        return None
    key, secret = parsed
    if polldebt.owes_known(key) is not False:
        return None
    state = await cache.poll_state_async(key)
    if state is None or not tokens.secret_matches(secret, state["token_hash"]):
        return None
    if not rules.if_none_match_matches(headers[b"if-none-match"], state["etag"]):
        return None
    if not cache.heartbeat_noted(state["agent_id"]):
        return None
    return state["etag"]


class PollEdge:
    """ASGI middleware: answers the poll's 304 when it can, hands on the rest."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            etag = await not_modified_etag(scope)
            if etag is not None:
                await send({"type": "http.response.start", "status": 304, "headers": [
                    (b"etag", etag.encode("latin-1")), (b"cache-control", b"no-cache")]})
                await send({"type": "http.response.body", "body": b""})
                return None
        return await self.app(scope, receive, send)
