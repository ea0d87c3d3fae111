"""Request throttling: the API's rates per user, per agent and per client address
(DRF throttles), failed API authentications per client address (a middleware, as
DRF authenticates before its throttles run), and the answer to a locked-out
sign-in (django-axes).

A throttle never fails a request because the cache is down: it lets the request
through, as the poll cache falls back to the database.
"""

import ipaddress
import logging
import math
import threading
import time

from axes.handlers.cache import AxesCacheHandler
from django.conf import settings
from django.core.cache import cache
from django.http import HttpResponse, JsonResponse
from django.utils.html import escape
from rest_framework.throttling import SimpleRateThrottle

from apps.core.breaker import best_effort_redis

logger = logging.getLogger(__name__)


def client_ip(request) -> str:
    """The client's address: REMOTE_ADDR, or with BELLWETHER_PROXY_COUNT proxies in
    front and the connection from one of BELLWETHER_TRUSTED_PROXIES, the address the
    outermost of them saw (its entry in X-Forwarded-For, counted from the right,
    where each proxy appends); nothing a client writes."""
    remote = request.META.get("REMOTE_ADDR", "") or ""
    proxies = settings.BELLWETHER_PROXY_COUNT
    forwarded = [a.strip() for a in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
                 if a.strip()]
    if not proxies or not forwarded or not _trusted_proxy(remote):
        return remote
    return forwarded[-min(proxies, len(forwarded))]


def _trusted_proxy(address: str) -> bool:
    try:
        peer = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(peer in network for network in settings.BELLWETHER_TRUSTED_PROXIES)


class _ScopedRateThrottle(SimpleRateThrottle):
    """A rate from BELLWETHER_THROTTLE_RATES[scope], read at each request (None:
    no limit), for the callers `ident` names (None: not this throttle's caller)."""

    scope = ""

    def __init__(self):  # the rate is read per request, not at start-up
        self.rate = None

    def ident(self, request) -> str | None:
        """Whose requests these are; each scope's subclass names its callers (this
        base names none, so it throttles nobody)."""
        return None

    def get_cache_key(self, request, view):
        ident = self.ident(request)
        return None if ident is None else self.cache_format % {"scope": self.scope,
                                                               "ident": ident}

    def allow_request(self, request, view):
        self.rate = settings.BELLWETHER_THROTTLE_RATES.get(self.scope)
        if self.rate is None:
            return True
        self.num_requests, self.duration = self.parse_rate(self.rate)
        if not best_effort_redis.allows():
            return True  # the cache failed a moment ago: do not wait on it again
        try:
            return super().allow_request(request, view)
        except Exception as exc:  # noqa: BLE001 - a cache down must not refuse requests
            logger.warning("throttle %s: cache unavailable, not throttling: %s",
                           self.scope, exc)
            best_effort_redis.failed(exc)
            return True

    def wait(self):
        wait = super().wait()
        return None if wait is None else max(1, math.ceil(wait))


class UserRateThrottle(_ScopedRateThrottle):
    """Per signed-in user, API tokens and sessions alike."""

    scope = "user"

    def ident(self, request):
        user = request.user
        if getattr(user, "agent", None) is not None or not user.is_authenticated:
            return None
        return str(user.pk)


class AgentRateThrottle(_ScopedRateThrottle):
    """Per agent (its token), however many hosts share an address."""

    scope = "agent"

    def ident(self, request):
        agent = getattr(request.user, "agent", None)
        return None if agent is None else str(agent.pk)


class AnonRateThrottle(_ScopedRateThrottle):
    """Per client address, for callers not signed in (enrollment, the schema)."""

    scope = "anon"

    def ident(self, request):
        return None if request.user.is_authenticated else client_ip(request)


class _BlockedAddresses:
    """Client addresses this process refuses until the end of their window (unix
    time): those whose failed authentications reached the bound. Kept in memory, so
    a refusal costs no cache or database call; each process learns a block from its
    own next failure (the count is shared). At most MAX addresses: the one whose
    block ends first makes room."""

    MAX = 10_000

    def __init__(self):
        self._lock = threading.Lock()
        self._until: dict[str, float] = {}

    def wait(self, address: str, now: float) -> int | None:
        """Seconds until `address` may try again (at least 1), or None if not blocked."""
        until = self._until.get(address)
        if until is None:
            return None
        if until <= now:
            with self._lock:
                self._until.pop(address, None)
            return None
        return max(1, math.ceil(until - now))

    def block(self, address: str, until: float) -> None:
        with self._lock:
            if address not in self._until and len(self._until) >= self.MAX:
                now = time.time()
                self._until = {a: u for a, u in self._until.items() if u > now}
                if len(self._until) >= self.MAX:
                    del self._until[min(self._until, key=self._until.get)]
            self._until[address] = max(until, self._until.get(address, 0.0))


blocked_addresses = _BlockedAddresses()
FAILED_AUTH_SCOPE = "failed_auth"


def _failed_auth_rate() -> tuple[int, int] | None:
    rate = settings.BELLWETHER_THROTTLE_RATES.get(FAILED_AUTH_SCOPE)
    return None if rate is None else SimpleRateThrottle.parse_rate(None, rate)


def authentication_failed(address: str, *, now: float | None = None) -> None:
    """Count a failed authentication from `address` in its window (fixed, of the
    rate's duration); at the bound, block the address until the window ends. The
    cache down: not counted (and not waited on again for a moment)."""
    rate = _failed_auth_rate()
    if rate is None or not best_effort_redis.allows():
        return
    limit, duration = rate
    now = time.time() if now is None else now
    window = int(now // duration)
    key = f"throttle_{FAILED_AUTH_SCOPE}_{address}_{window}"
    try:
        cache.add(key, 0, timeout=duration + 1)
        try:
            count = cache.incr(key)
        except ValueError:  # expired between add and incr: a new window
            cache.add(key, 1, timeout=duration + 1)
            count = 1
    except Exception as exc:  # noqa: BLE001 - a cache down must not refuse requests
        logger.warning("failed authentications: cache unavailable, not counted: %s", exc)
        best_effort_redis.failed(exc)
        return
    if count >= limit:
        blocked_addresses.block(address, (window + 1) * duration)


def presented_credential_refused(request, response) -> bool:
    """A `401` that refused a credential the caller presented: an Authorization
    header (user and agent tokens, the cached poll path too), or a token in the body
    (enrollment). A request with no credential costs nothing to refuse and is not
    counted: any web page can make a browser send one, and counting it would let
    that page lock out everyone behind the browser's address."""
    if response.status_code != 401:
        return False
    return bool(request.META.get("HTTP_AUTHORIZATION", "").strip()) or bool(
        getattr(response, "credential_refused", False))


def blocked_answer(wait: int) -> JsonResponse:
    """The answer to an address refused for its failed authentications, `wait`
    seconds before its window ends."""
    return JsonResponse({"error": {
        "code": "throttled",
        "message": f"Request was throttled: too many failed authentications from "
                   f"this address. Expected available in {wait} seconds."}},
        status=429, headers={"Retry-After": str(wait)})


class FailedAuthenticationMiddleware:
    """On API paths: a client address whose failed authentications (`401` answers to
    a presented credential: bad, unknown, revoked or expired user, agent and
    enrollment tokens) reached BELLWETHER_THROTTLE_RATES["failed_auth"] is answered
    `429` with Retry-After until its window ends, before any token is looked up."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if not request.path.startswith("/api/") or _failed_auth_rate() is None:
            return self.get_response(request)
        address = client_ip(request)
        wait = blocked_addresses.wait(address, time.time())
        if wait is not None:
            return blocked_answer(wait)
        response = self.get_response(request)
        if presented_credential_refused(request, response):
            authentication_failed(address)
        return response


class _FailOpenCache:
    """The cache, answering as if it held nothing when it cannot be reached."""

    FALLBACK = {"get": None, "add": True, "incr": 1, "touch": False, "delete": False}

    def __init__(self, cache):
        self._cache = cache

    def __getattr__(self, name):
        method = getattr(self._cache, name)

        def call(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - a cache down must not refuse sign-ins
                logger.warning("sign-in attempts: cache unavailable, not counted: %s", exc)
                return kwargs.get("default", 0) if name == "get" else self.FALLBACK.get(name)

        return call


class LoginAttemptsCacheHandler(AxesCacheHandler):
    """django-axes' cache handler that lets sign-ins through, uncounted, while the
    cache (Redis) is down, rather than failing them with a 500."""

    def __init__(self):
        super().__init__()
        self.cache = _FailOpenCache(self.cache)


def login_locked_out(request, original_response=None, credentials=None) -> HttpResponse:
    """django-axes' answer to a sign-in while its username and address are locked
    out: 429 with Retry-After, whether the password is right or not."""
    cooloff = settings.BELLWETHER_LOGIN_COOLOFF_S
    minutes = max(1, math.ceil(cooloff / 60))
    body = (f"<!doctype html><title>Too many sign-in attempts</title><h1>Too many "
            f"sign-in attempts</h1><p>Too many failed sign-ins for this user from "
            f"{escape(client_ip(request))}. Try again in {minutes} minute(s).</p>")
    response = HttpResponse(body, status=429)
    response["Retry-After"] = str(cooloff)
    return response
