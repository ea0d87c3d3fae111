"""The agent's long-polling (agent/runner.py, agent/client.py): `?wait=N` only after the
server advertised `Bellwether-Long-Poll`, the next poll at once after a held poll or a
change, the plain interval after a poll the server could not hold, plain polling
after an error, and a request timeout longer than the wait."""

from __future__ import annotations

import threading
import time

import pytest

from agent.apply import SUCCEEDED
from agent.client import Client
from tests.agent.support import make_bundle, text_tree

V1 = {"app.conf": "one\n"}
V2 = {"app.conf": "two\n"}
INTERVAL = 10  # the ProtocolServer's poll_interval_s


class Stop(Exception):
    pass


def run_polls(agent, polls: int) -> list[float]:
    """Agent.run() until it has slept `polls` times; the delays it slept."""
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) >= polls:
            raise Stop

    agent.sleep = sleep
    with pytest.raises(Stop):
        agent.run()
    return delays


def waits(server) -> list[str | None]:
    """The ?wait= of every desired request, in order (None: a plain poll)."""
    return [path.partition("?wait=")[2] or None for _, path, *_ in server.calls("desired")]


def test_without_the_header_the_agent_polls_plainly(host, server):
    server.publish(make_bundle(1, V1))
    agent = host.agent(server.url)

    delays = run_polls(agent, 3)

    assert waits(server) == [None, None, None]
    assert delays == [INTERVAL] * 3


def test_after_the_header_the_agent_long_polls_within_interval_and_maximum(host, server):
    server.publish(make_bundle(1, V1))
    server.long_poll_s, server.hold = 60, False  # answers at once: a server that cannot hold
    agent = host.agent(server.url)

    delays = run_polls(agent, 3)

    # The first poll learns the header; later ones ask for the interval (within 60).
    assert waits(server) == [None, str(INTERVAL), str(INTERVAL)]
    # The header just seen: the first hold is asked at once (a change published
    # meanwhile must not wait a whole interval). Then a 304 much sooner than asked:
    # the plain interval follows, not a tight loop.
    assert delays == [0.0, INTERVAL, INTERVAL]


def test_the_wait_is_capped_by_the_advertised_maximum(host, server):
    server.publish(make_bundle(1, V1))
    server.long_poll_s, server.hold = 3, False
    agent = host.agent(server.url)

    run_polls(agent, 2)

    assert waits(server) == [None, "3"]


@pytest.mark.slow
def test_a_held_poll_is_followed_by_the_next_at_once(host, server):
    server.publish(make_bundle(1, V1))
    server.long_poll_s = 1  # held 1 s each
    agent = host.agent(server.url)

    delays = run_polls(agent, 3)

    assert waits(server) == [None, "1", "1"]
    assert delays == [0.0, 0.0, 0.0]


def test_a_change_during_the_hold_is_applied_at_once(host, server):
    server.publish(make_bundle(1, V1))
    server.long_poll_s = 30
    agent = host.agent(server.url)
    agent.run_once()
    agent.client.long_poll_s = 30
    threading.Timer(0.3, lambda: server.publish(make_bundle(2, V2))).start()

    started = time.monotonic()
    outcome = agent.cycle(agent._long_poll_wait())

    assert time.monotonic() - started < 5
    assert outcome.status == SUCCEEDED and text_tree(host.target) == V2
    assert waits(server)[-1] == str(INTERVAL)
    assert agent._delay_after(INTERVAL, 0.3) == 0.0  # a 200: poll again at once


def test_after_an_error_the_agent_polls_plainly_until_advertised_again(host, server):
    server.publish(make_bundle(1, V1))
    server.long_poll_s, server.hold = 60, False
    agent = host.agent(server.url)
    agent.run_once()
    server.fail("desired", 503)

    run_polls(agent, 3)

    # wait, 503 (advertised nothing), a plain poll that learns the header, wait again.
    assert waits(server)[1:] == [str(INTERVAL), None, str(INTERVAL)]


@pytest.mark.parametrize("header", ["0", "-1", "abc", "1.5", "99999", ""])
def test_a_header_that_is_no_positive_number_means_no_long_poll(host, server, header):
    server.publish(make_bundle(1, V1))
    server.long_poll_s = header or None
    agent = host.agent(server.url)

    run_polls(agent, 2)

    assert waits(server) == [None, None]


@pytest.mark.slow
def test_the_request_timeout_covers_the_wait(server):
    server.publish(make_bundle(1, V1))
    server.long_poll_s = 2
    client = Client(server.url, token=server.token, timeout=0.5)
    _, etag, _ = client.desired(None)

    started = time.monotonic()
    status, _, _ = client.desired(etag, wait=2)  # held 2 s, longer than the 0.5 s timeout

    assert status == 304 and time.monotonic() - started >= 1.9
    assert client.long_poll_s == 2
