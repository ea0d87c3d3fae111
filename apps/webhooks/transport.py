"""Sending one webhook request: POST only, short timeouts, no redirects followed
(http.client never follows one), the response read up to a bound, and the host's
addresses checked before connecting — to the very address checked, so a name
cannot resolve to a public address for the check and a private one for the
connection (docs/security.md, "Webhooks")."""

import http.client
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from apps.webhooks.rules import address_refused

MAX_RESPONSE_BYTES = 4096


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


def _address(host: str, port: int, allow_private: bool) -> str:
    """The address to connect to: every address of `host` must be allowed (a name
    with one private address among public ones is refused)."""
    addresses = [info[4][0] for info in socket.getaddrinfo(host, port,
                                                           type=socket.SOCK_STREAM)]
    if not allow_private:
        refused = [a for a in addresses if address_refused(a)]
        if refused:
            raise PermissionError(f"{host} resolves to {refused[0]}, a private or "
                                  "loopback address")
    return addresses[0]


def post(url: str, body: bytes, headers: dict, *, timeout_s: float,
         allow_private: bool) -> Outcome:
    """POST `body` to `url`; never raises for what the receiver or network does."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    started = time.monotonic()
    try:
        address = _address(parts.hostname, port, allow_private)
    except PermissionError as exc:
        return Outcome(error=str(exc)[:500], refused=True)
    except OSError as exc:
        return Outcome(error=f"cannot resolve {parts.hostname}: {exc}"[:500])
    kind = _PinnedHTTPS if parts.scheme == "https" else _PinnedHTTP
    connection = kind(parts.hostname, port, address=address, timeout=timeout_s)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        excerpt = response.read(MAX_RESPONSE_BYTES)
        return Outcome(status=response.status, ms=int((time.monotonic() - started) * 1000),
                       response=excerpt.decode("utf-8", "replace")[:1000])
    except (OSError, http.client.HTTPException) as exc:
        return Outcome(error=f"{type(exc).__name__}: {exc}"[:500],
                       ms=int((time.monotonic() - started) * 1000))
    finally:
        connection.close()
