"""PostgreSQL down (a private cluster, stopped with `pg_ctl stop -m immediate`):
API requests answer 503 with the error envelope within 2 s, dashboard pages a plain
503 (a signed-in session included: its middleware reads the session from the
database), /readyz says so while /healthz stays 200, an agent's poll answered from
the cache still gets its 304, and service resumes once the database is back. Run in
a process configured as production configures it (settings from the environment)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys, time
import django
django.setup()
from tests import agentroutes
agentroutes.install()  # the agents' routes through the ASGI stack, as served
from django.conf import settings
from django.db import close_old_connections
from django.test import Client
from django.test.utils import override_settings

# Pages link static files without a collectstatic manifest (nothing here is served).
override_settings(STORAGES={**settings.STORAGES, "staticfiles": {
    "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"}}).enable()

client = Client(raise_request_exception=False)
signed_in = agent = etag = None

def get(path, method="get", via=None, **headers):
    # A server closes unusable connections around each request (the test client
    # leaves that out): so does the probe.
    close_old_connections()
    start = time.monotonic()
    response = getattr(via or client, method)(path, **headers)
    close_old_connections()
    return {"status": response.status_code, "seconds": time.monotonic() - start,
            "body": response.content.decode()}

def set_up():
    # A schema, a user signed in, and an agent whose poll answer is cached.
    global signed_in, agent, etag
    from django.core.management import call_command
    from tests import factories
    call_command("migrate", verbosity=0)
    root = factories.superuser()
    environment = factories.environment(
        factories.application(factories.tenant(actor=root), actor=root), actor=root,
        templates=factories.SHOP_TEMPLATES)
    factories.publish(environment, root)
    signed_in = factories.session_client(root, raise_request_exception=False)
    agent = factories.bearer_client(factories.enrolled_agent(environment, actor=root).token)
    etag = factories.poll(agent)["ETag"]
    factories.poll(agent, etag)  # the poll debts read, as on a node serving polls
    return {"page": get("/", via=signed_in)["status"], "etag": etag}

token = {"HTTP_AUTHORIZATION": "Bearer bwu_000000000000.secret"}
for line in sys.stdin:
    if line.strip() == "wait-ready":
        start = time.monotonic()
        while get("/readyz")["status"] != 200 and time.monotonic() - start < 20:
            time.sleep(0.1)
        print(json.dumps({"ready_after": time.monotonic() - start}), flush=True)
    elif line.strip() == "set-up":
        print(json.dumps(set_up()), flush=True)
    else:
        print(json.dumps({
            "readyz": get("/readyz"), "healthz": get("/healthz"),
            "api": get("/api/v1/environments", **token),
            "agent": get("/api/v1/agent/desired",
                         HTTP_AUTHORIZATION="Bearer bwa_000000000000.s"),
            "api_session": get("/api/v1/environments", via=signed_in),
            "page_session": get("/", via=signed_in),
            "post_session": get("/e/shop/prod/rollouts/999/confirm/", method="post",
                                via=signed_in),
            "poll_cached": get("/api/v1/agent/desired", via=agent, HTTP_IF_NONE_MATCH=etag),
        }), flush=True)
"""


# DEBUG off with a host: production, where a weak SECRET_KEY would stop start-up.
STRONG_TEST_KEY = "faults-only-" + "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGH"


def test_a_database_outage_answers_503_fast_and_service_resumes(private_postgres, tmp_path):
    environ = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    environ.update(DATABASE_URL=private_postgres.url, SECRET_KEY=STRONG_TEST_KEY,
                   ALLOWED_HOSTS="testserver", BELLWETHER_VAR_DIR=str(tmp_path / "var"),
                   DJANGO_SETTINGS_MODULE="project.settings")
    probe = subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, env=environ,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(line: str) -> dict:
        probe.stdin.write(line + "\n")
        probe.stdin.flush()
        return json.loads(probe.stdout.readline())

    try:
        assert ask("wait-ready")["ready_after"] < 20
        assert ask("set-up")["page"] == 200
        private_postgres.stop()
        down = ask("probe")
        time.sleep(8)  # a longer outage: the pool's retry delay would have grown to 8 s
        private_postgres.start()
        started = time.monotonic()
        back = ask("wait-ready")
        resumed_after = time.monotonic() - started
        again = ask("probe")
    finally:
        probe.kill()
        probe.wait()

    for name in ("readyz", "api", "agent", "api_session"):
        answer = down[name]
        assert answer["status"] == 503, (name, answer)
        assert json.loads(answer["body"])["error"]["code"] == "unavailable", (name, answer)
        assert answer["seconds"] < 2, (name, answer)
    for name in ("page_session", "post_session"):  # dashboard pages: a plain 503
        answer = down[name]
        assert (answer["status"], answer["seconds"] < 2) == (503, True), (name, answer)
        assert "the database is down" in answer["body"], (name, answer)
    # An agent whose answer is cached keeps its 304: the poll touches no database.
    assert (down["poll_cached"]["status"], down["poll_cached"]["seconds"] < 2) == (304, True), \
        down["poll_cached"]
    assert json.loads(down["readyz"]["body"])["error"]["details"][0]["dependency"] == "database"
    assert down["healthz"]["status"] == 200
    assert back["ready_after"] < 2 and resumed_after < 2, (back, resumed_after)
    # The signed-in session and the cached poll survived the outage.
    assert again["page_session"]["status"] == 200, again["page_session"]
    assert again["api_session"]["status"] == 200, again["api_session"]
    assert again["poll_cached"]["status"] == 304, again["poll_cached"]
