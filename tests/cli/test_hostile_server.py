"""The CLI against servers that misbehave on purpose (a small http.server in a
thread, no Bellwether): a redirect never carries the token anywhere, a call
ends within timeout_s however slowly the answer drips, an answer has a size
limit, a list that never ends is stopped, credentials in the server URL are
never shown, and a config file holding a token that others may read is warned
about."""

from __future__ import annotations

import io
import json
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

import pytest

from cli import client as client_module
from cli import commands
from cli.errors import REFUSED, UNREACHABLE, USAGE
from cli.main import main as cli_main
from tests.ports import serve_in_thread

TOKEN = "bwu_abcdef123456.s3cr3t-value"
DRIP_S = 0.25


class Recorder(BaseHTTPRequestHandler):
    """Answers with its class's `answer(handler)`; remembers each request's headers."""

    seen: list
    answer = None

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.seen.append({"path": self.path, "headers": dict(self.headers)})
        type(self).answer(self)

    def log_message(self, *args):
        pass


@contextmanager
def hostile(answer):
    """(url, requests seen) of a server answering every GET with answer(handler)."""
    handler = type("Hostile", (Recorder,), {"seen": [], "answer": staticmethod(answer)})
    server = serve_in_thread(handler)
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.seen
    finally:
        server.shutdown()
        server.server_close()


def run(tmp_path, *args, url: str, config: str | None = None, **environ):
    """cli.main.main in process: (exit code, stdout, stderr)."""
    env = {"HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / ".config"),
           "BELLWETHER_URL": url, "BELLWETHER_TOKEN": TOKEN, **environ}
    if config is not None:
        env.pop("BELLWETHER_TOKEN")
        path = tmp_path / "config.toml"
        path.write_text(config)
        path.chmod(0o600)
        env["BELLWETHER_CONFIG"] = str(path)
    stdout, stderr = io.StringIO(), io.StringIO()
    code = cli_main(list(args), environ=env, stdout=stdout, stderr=stderr)
    return code, stdout.getvalue(), stderr.getvalue()


def json_answer(body: object, status: int = 200):
    def answer(handler):
        data = json.dumps(body).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
    return answer


def redirect_to(location: str):
    def answer(handler):
        handler.send_response(302)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return answer


@pytest.mark.parametrize("elsewhere", ["another host", "the same host"])
def test_a_redirect_is_refused_and_the_token_goes_nowhere_else(tmp_path, elsewhere):
    with hostile(json_answer({"results": [], "next": None})) as (target, target_seen):
        if elsewhere == "the same host":
            answer = redirect_to("/api/v1/other")
        else:
            answer = redirect_to(target.replace("http://", "http://bob:pw@") + "/steal")
        with hostile(answer) as (url, seen):
            code, out, err = run(tmp_path, "environments", "-o", "json", url=url)
    assert code == REFUSED
    assert seen[0]["headers"]["Authorization"] == f"Bearer {TOKEN}"  # the server asked for
    assert len(seen) == 1 and target_seen == []  # not followed, anywhere
    error = json.loads(out)["error"]
    assert (error["status"], error["code"]) == (302, "redirect")
    assert "does not follow redirects" in err
    if elsewhere == "another host":
        assert f"http://***@127.0.0.1:{target.rsplit(':', 1)[1]}/steal" in err
        assert "bob:pw" not in err + out
    else:
        assert "redirecting to /api/v1/other" in err


def drip(where: str):
    """An answer sent one byte at a time: its headers, or its body."""
    def answer(handler):
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 40\r\n"
        body = b'{"results": [], "next": null}' + b" " * 11
        if where == "headers":
            head += b"X-Slow: " + b"a" * 40 + b"\r\n"
        try:
            slow = head if where == "headers" else body
            handler.wfile.write(b"" if where == "headers" else head + b"\r\n")
            for byte in slow:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(DRIP_S)
            handler.wfile.write(b"\r\n" + body if where == "headers" else b"")
        except OSError:
            pass  # the CLI hung up: what it should do
    return answer


@pytest.mark.slow
@pytest.mark.parametrize("where", ["headers", "body"])
def test_an_answer_dripping_a_byte_at_a_time_ends_within_timeout_s(tmp_path, where):
    with hostile(drip(where)) as (url, _):
        config = f'[profiles.default]\nurl = "{url}"\ntoken = "{TOKEN}"\ntimeout_s = 1\n'
        started = time.monotonic()
        code, _, err = run(tmp_path, "environments", url=url, config=config)
        took = time.monotonic() - started
    assert code == UNREACHABLE, err
    assert "no complete answer from" in err and "within 1 s" in err
    assert took < 5  # the drip would last over 10 s; each byte comes within timeout_s


def test_an_answer_larger_than_the_limit_is_not_read(tmp_path, monkeypatch):
    def endless(handler):  # no Content-Length: the body ends when the connection does
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.end_headers()
        try:
            for _ in range(64):
                handler.wfile.write(b" " * 65536)
        except OSError:
            pass
        handler.close_connection = True

    monkeypatch.setattr(client_module, "MAX_ANSWER_BYTES", 1024 * 1024)
    with hostile(endless) as (url, _):
        code, _, err = run(tmp_path, "environments", url=url)
    assert code == UNREACHABLE and "is larger than 1 MiB: not read" in err

    def declared(handler):
        handler.send_response(200)
        handler.send_header("Content-Length", str(100 * 1024 * 1024))
        handler.end_headers()

    with hostile(declared) as (url, _):
        code, _, err = run(tmp_path, "environments", url=url)
    assert code == UNREACHABLE and "is larger than 1 MiB" in err


@pytest.mark.slow
def test_a_list_that_never_ends_is_stopped(tmp_path, monkeypatch):
    page = {"results": [{"full_name": "a/b"}], "next": "http://x/?offset=500"}
    with hostile(json_answer(page)) as (url, seen):
        code, _, err = run(tmp_path, "environments", "-o", "json", url=url)
    assert code == REFUSED and "named the same next page twice" in err
    assert len(seen) == 2

    def onwards(handler):
        json_answer({"results": [{"full_name": "a/b"}],
                     "next": f"http://x/?n={len(handler.seen)}"})(handler)

    monkeypatch.setattr(commands, "MAX_PAGES", 5)
    with hostile(onwards) as (url, seen):
        code, _, err = run(tmp_path, "environments", "-o", "json", url=url)
    assert code == REFUSED and "did not end after 5 pages (5 items)" in err
    assert len(seen) == 5


def test_an_answer_that_is_not_http_is_unreachable_not_a_traceback(tmp_path):
    def garbage(handler):
        handler.wfile.write(b"SSH-2.0-OpenSSH_9.6\r\n")
        handler.close_connection = True

    with hostile(garbage) as (url, _):
        code, _, err = run(tmp_path, "environments", url=url)
    assert code == UNREACHABLE and "did not answer in HTTP" in err


def test_credentials_in_the_server_url_are_refused_and_never_shown(tmp_path):
    url = "http://alice:hunter2@127.0.0.1:9"
    code, out, err = run(tmp_path, "environments", "-o", "json", url=url)
    assert code == USAGE
    assert "hunter2" not in out + err and "alice" not in out + err
    assert "http://***@127.0.0.1:9" in err and "holds a user or password" in err
    code, _, err = run(tmp_path, "config", url="ftp://alice:hunter2@host")
    assert code == USAGE and "hunter2" not in err and "not a server URL" in err


def test_a_token_file_others_may_read_is_warned_about_once(tmp_path):
    config = f'[profiles.default]\nurl = "http://127.0.0.1:9"\ntoken = "{TOKEN}"\n'
    code, _, err = run(tmp_path, "config", url="", config=config)
    assert code == 0 and "warning" not in err  # 0600
    path = tmp_path / "config.toml"
    path.chmod(0o644)
    env = {"BELLWETHER_CONFIG": str(path), "HOME": str(tmp_path)}
    stderr = io.StringIO()
    assert cli_main(["config"], environ=env, stdout=io.StringIO(), stderr=stderr) == 0
    warning = stderr.getvalue()
    assert warning.count("warning:") == 1
    assert f"{path} holds a token and others may read it (mode 0644)" in warning
    assert f"chmod 600 {path}" in warning and TOKEN not in warning

    token_file = tmp_path / "prod.token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o640)
    path.write_text(f'[profiles.default]\nurl = "http://127.0.0.1:9"\n'
                    f'token_file = "{token_file}"\n')
    stderr = io.StringIO()
    assert cli_main(["config"], environ=env, stdout=io.StringIO(), stderr=stderr) == 0
    assert f"{token_file} holds a token and others may read it (mode 0640)" in \
        stderr.getvalue()
    env["BELLWETHER_TOKEN"] = TOKEN  # the file's token is not used: nothing to say
    stderr = io.StringIO()
    assert cli_main(["config"], environ=env, stdout=io.StringIO(), stderr=stderr) == 0
    assert "warning" not in stderr.getvalue()
