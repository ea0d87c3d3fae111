"""Sending one webhook request: POST only, short timeouts, no redirects followed
(http.client never follows one), the response read up to a bound, and the host's
addresses checked before connecting — to the very address checked, so a name
cannot resolve to a public address for the check and a private one for the
connection (docs/security.md, "Webhooks"). A lookup is bounded too: the resolver
runs in a thread of its own and is given up after a short wait."""

import http.client
import socket
import threading
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from apps.webhooks import rules

MAX_RESPONSE_BYTES = 4096
# Lookups given up on whose resolver has not answered yet: each holds a thread until
# the system resolver's own timeout ends it; beyond this many, a lookup is given up
# at once rather than starting another thread.
MAX_PENDING_LOOKUPS = 16
_pending_lookups = threading.BoundedSemaphore(MAX_PENDING_LOOKUPS)


@dataclass
class Outcome:
    status: int | None = None
    error: str = ""
    response: str = ""
    ms: int = 0
    refused: bool = False  # the address was refused: trying again will not help

    @property
    def succeeded(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class Refused(Exception):
    """The URL or an address of its host may not be reached: trying again will not help."""


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, host, port, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self):
        self.sock = socket.create_connection((self.address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, host, port, *, address: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self.address = address

    def connect(self):
        sock = socket.create_connection((self.address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


class ResolveTimeout(OSError):
    """The resolver did not answer within the wait: the name is not known to resolve
    (a delivery tries again later; a registration passes it, as a name that does not
    resolve yet)."""


def _lookup(host: str, port: int, wait_s: float) -> list:
    """socket.getaddrinfo in a thread of its own, given up (ResolveTimeout) after
    `wait_s` seconds; the thread ends when the resolver answers or times out itself."""
    if not _pending_lookups.acquire(blocking=False):
        raise ResolveTimeout(f"{MAX_PENDING_LOOKUPS} earlier lookups have not been "
                             "answered yet")
    answer: dict = {}
    done = threading.Event()

    def run():
        try:
            answer["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            answer["error"] = exc
        finally:
            _pending_lookups.release()
            done.set()

    threading.Thread(target=run, name="webhook-resolve", daemon=True).start()
    if not done.wait(wait_s):
        raise ResolveTimeout(f"the resolver did not answer within {wait_s:g} s")
    if "error" in answer:
        raise answer["error"]
    return answer["infos"]


def resolve(host: str, port: int, *, wait_s: float) -> list[str]:
    """Every address of the URL's host: the address itself when it is written as one
    (never handed to a resolver that reads 0x7f.1 as 127.0.0.1), else the name's,
    looked up within `wait_s` seconds (ResolveTimeout, an OSError, after)."""
    literal = rules.host_address(host)
    if literal is not None:
        return [str(literal)]
    addresses = [info[4][0] for info in _lookup(host, port, wait_s)]
    if not addresses:
        raise OSError("no address")
    return addresses


def addresses_refusal(host: str, addresses: list[str]) -> str | None:
    """Why the host may not be reached when any one of its addresses may not (a
    name with one private address among public ones is refused), or None."""
    for address in addresses:
        why = rules.address_refusal(address)
        if why:
            return f"{host} resolves to {address}: {why}; {rules.REFUSED_UNLESS_ALLOWED}"
    return None


def _url_port(parts) -> int:
    return parts.port or (443 if parts.scheme == "https" else 80)


def host_refusal(url: str, *, wait_s: float) -> str | None:
    """At registration: why the host of a well-formed URL resolves to an address a
    webhook must not reach, or None. A name that does not resolve (yet) passes, as
    does one whose resolver does not answer within `wait_s` seconds: every delivery
    resolves and checks it again."""
    parts = urlsplit(url)
    try:
        addresses = resolve(parts.hostname, _url_port(parts), wait_s=wait_s)
    except (OSError, UnicodeError):
        return None
    return addresses_refusal(parts.hostname, addresses)


def _address(url: str, allow_private: bool, resolve_wait_s: float) -> str:
    """The one address the request goes to: the URL checked again as at registration
    (a row stored before a rule existed), then every address of its host."""
    problem = rules.url_problem(url, allow_private=allow_private)
    if problem:
        raise Refused(f"the URL is refused: {problem}")
    parts = urlsplit(url)
    addresses = resolve(parts.hostname, _url_port(parts), wait_s=resolve_wait_s)
    why = None if allow_private else addresses_refusal(parts.hostname, addresses)
    if why:
        raise Refused(why)
    return addresses[0]


def post(url: str, body: bytes, headers: dict, *, timeout_s: float,
         allow_private: bool, resolve_wait_s: float) -> Outcome:
    """POST `body` to `url`, connecting to the address checked (so a name that
    resolves anew to a private address, DNS rebinding, is never reached); never
    raises for what the URL, the receiver or the network does. The lookup takes at
    most `resolve_wait_s`, connecting and each read `timeout_s`."""
    started = time.monotonic()
    try:
        address = _address(url, allow_private, resolve_wait_s)
    except Refused as exc:
        return Outcome(error=str(exc)[:500], refused=True)
    except (OSError, UnicodeError) as exc:
        return Outcome(error=f"cannot resolve the host: {exc}"[:500])
    parts = urlsplit(url)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    kind = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    connection = None
    try:
        connection = kind(parts.hostname, _url_port(parts), address=address,
                          timeout=timeout_s)
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        excerpt = response.read(MAX_RESPONSE_BYTES)
        return Outcome(status=response.status, ms=int((time.monotonic() - started) * 1000),
                       response=excerpt.decode("utf-8", "replace")[:1000])
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:500],
                       ms=int((time.monotonic() - started) * 1000))
    finally:
        if connection is not None:
            connection.close()
