"""Fixtures of the webhook tests: private addresses allowed (the receiver runs on
127.0.0.1), retries due at once unless a test says otherwise, and a live receiver."""

import socket

import pytest

from tests.rollouts.conftest import _empty_cache, fleet, second  # noqa: F401 - fixtures
from tests.webhooks import receiver as receivers


@pytest.fixture(autouse=True)
def _webhook_settings(settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": True,
                                    "timeout_s": 1, "max_attempts": 4, "backoff_s": 0}


@pytest.fixture
def receiver():
    """(Receiver, url): a real HTTP server for the test, stopped after it."""
    live = receivers.Receiver()
    server, url = receivers.start(live)
    yield live, url
    server.shutdown()
    server.server_close()


class FakeDNS:
    """The resolver's answers for some names: `answer(name, [addresses], ...)`, one
    list per lookup in turn (the last repeats); every other host resolves as usual.
    `lookups` lists the names looked up; `connections` the addresses connected to."""

    def __init__(self, real_getaddrinfo, real_connect):
        self.answers, self.lookups, self.connections = {}, [], []
        self._getaddrinfo, self._connect = real_getaddrinfo, real_connect

    def answer(self, name: str, *answers: list[str]) -> None:
        self.answers[name] = list(answers)

    def getaddrinfo(self, host, port, *args, **kwargs):
        name = host[:-1] if isinstance(host, str) and host.endswith(".") else host
        if name not in self.answers:
            return self._getaddrinfo(host, port, *args, **kwargs)
        self.lookups.append(name)
        queue = self.answers[name]
        addresses = queue.pop(0) if len(queue) > 1 else queue[0]
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "",
                 (a, port, 0, 0) if ":" in a else (a, port)) for a in addresses]

    def create_connection(self, address, *args, **kwargs):
        self.connections.append(address)
        return self._connect(address, *args, **kwargs)


@pytest.fixture
def dns(monkeypatch):
    fake = FakeDNS(socket.getaddrinfo, socket.create_connection)
    monkeypatch.setattr(socket, "getaddrinfo", fake.getaddrinfo)
    monkeypatch.setattr(socket, "create_connection", fake.create_connection)
    return fake
