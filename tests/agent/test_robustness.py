"""The agent stays up and consistent when things go wrong in unexpected ways."""

import contextlib
import gzip
import socket
import threading

import pytest

from agent import client as client_module
from agent.apply import FAILED, SUCCEEDED
from agent.client import Client, ProtocolError, Unreachable
from agent.runner import EXIT_ERROR, Agent
from tests.agent.support import closed_port, make_bundle


def test_the_result_and_its_report_are_saved_in_one_write(host):
    def record(state, outcome):
        state.unsent_report = {"snapshot": 1, "status": outcome.status}

    outcome = host.applier().apply(make_bundle(1, {"a.conf": "a\n"}), host.load_state(),
                                   record=record)

    saved = host.load_state()
    assert outcome.status == SUCCEEDED
    assert (saved.active_number, saved.unsent_report) == (1, {"snapshot": 1,
                                                              "status": SUCCEEDED})
    assert saved.in_progress is None


@pytest.mark.parametrize("bundle", [
    {"number": 1, "checksum": "sha256:x"},
    {"number": "1", "checksum": "sha256:x", "files": []},
    {"number": 1, "checksum": "sha256:x", "files": [{"path": 1, "content": "x"}]},
])
def test_a_malformed_bundle_fails_without_writing(host, bundle):
    outcome = host.applier().apply(bundle, host.load_state())

    assert outcome.status == FAILED
    assert list(host.target.iterdir()) == []


@pytest.fixture
def truncating_server():
    """Answers 200 with a Content-Length it does not keep, then hangs up."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def serve():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.recv(65536)
            connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 100\r\n\r\n{\"snap")
            connection.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    # shutdown() wakes the blocked accept(); close() alone leaves the thread in it,
    # on a descriptor number the next test's server may reuse.
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    thread.join(timeout=5)


def test_a_truncated_answer_counts_as_an_unreachable_server(truncating_server):
    with pytest.raises(Unreachable):
        Client(truncating_server, token="bwa_x.y").desired(None)


class _Exploding:
    def report(self, report):
        raise AssertionError("not reached")

    def desired(self, etag, wait=None):
        raise RuntimeError("a bug")


def test_an_unexpected_error_backs_off_and_keeps_running(host):
    delays = []

    def sleep(seconds):
        delays.append(seconds)
        if len(delays) == 3:
            raise KeyboardInterrupt

    agent = Agent(client=_Exploding(), applier=host.applier(), state=host.load_state(),
                  save=host.save, sleep=sleep, rng=lambda: 1.0)
    with pytest.raises(KeyboardInterrupt):
        agent.run()

    assert delays == [2.0, 4.0, 8.0]


def test_an_unexpected_error_in_once_mode_has_its_own_exit_code(host):
    agent = Agent(client=_Exploding(), applier=host.applier(), state=host.load_state(),
                  save=host.save)

    assert agent.run_once() == EXIT_ERROR


@pytest.fixture
def silent_server():
    """Accepts connections and never answers; counts them."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    accepted = []

    def serve():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            accepted.append(connection)  # held open, never answered

    threading.Thread(target=serve, daemon=True).start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    listener.close()
    for connection in accepted:
        connection.close()


def test_a_first_server_that_times_out_is_asked_last_until_its_rest_is_over(
        silent_server, server):
    silent_url, accepted = silent_server
    now = [1000.0]
    client = Client([silent_url, server.url], token=server.token, timeout=0.3,
                    clock=lambda: now[0])

    first = client.desired(None)
    second = client.desired(None)
    asked_while_resting = len(accepted)
    now[0] += client_module.TIMED_OUT_REST_S + 1
    third = client.desired(None)

    assert [answer[0] for answer in (first, second, third)] == [200, 200, 200]
    assert asked_while_resting == 1  # the second poll went straight to the answering one
    assert len(accepted) == 2  # after its rest, the first server is asked first again


def test_a_refusing_first_server_is_asked_first_on_every_poll(server):
    client = Client([f"http://127.0.0.1:{closed_port()}", server.url], token=server.token,
                    timeout=5)

    client.desired(None)

    assert client.resting_until == {}  # refused is an answer in no time: no rest


# --- gzip bundles --------------------------------------------------------------------


def test_the_agent_asks_for_gzip_bundles_and_applies_them(host, server):
    server.publish(make_bundle(1, {"a.conf": "a\n" * 1000}))

    outcome = host.agent(server.url).cycle()

    assert outcome.status == SUCCEEDED
    [headers] = [h for _, _, route, h, _ in server.requests if route == "bundle"]
    assert headers["Accept-Encoding"] == "gzip"
    assert (host.target / "a.conf").read_text() == "a\n" * 1000


@pytest.mark.parametrize("body", [
    b"not gzip at all",
    gzip.compress(b'{"number": 1}', mtime=0)[:-6],  # truncated
    gzip.compress(b" " * 5000, mtime=0),  # inflates past the limit (set to 4096 here): a bomb
])
def test_a_gzip_bundle_that_does_not_inflate_is_a_bad_answer_not_a_crash(
        host, server, body, monkeypatch):
    monkeypatch.setattr(client_module, "MAX_INFLATED_BYTES", 4096)
    server.publish(make_bundle(1, {"a.conf": "a\n"}))
    server.gzip_body = lambda bundle: body

    with pytest.raises(ProtocolError) as raised:
        host.agent(server.url).cycle()

    assert raised.value.code == "bad_response"
    assert "gzip body" in str(raised.value)
    assert list(host.target.iterdir()) == []
