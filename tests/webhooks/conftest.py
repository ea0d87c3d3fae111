"""Fixtures of the webhook tests: private addresses allowed (the receiver runs on
127.0.0.1), retries due at once unless a test says otherwise, and a live receiver."""

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
