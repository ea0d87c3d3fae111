"""PostgreSQL down (a private cluster, stopped with `pg_ctl stop -m immediate`):
API requests answer 503 with the error envelope within 2 s, /readyz says so while
/healthz stays 200, and service resumes once the database is back. Run in a process
configured as production configures it (settings from the environment)."""

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
from django.db import close_old_connections
from django.test import Client

client = Client()

def get(path, **headers):
    # A server closes unusable connections around each request (the test client
    # leaves that out): so does the probe.
    close_old_connections()
    start = time.monotonic()
    response = client.get(path, **headers)
    close_old_connections()
    return {"status": response.status_code, "seconds": time.monotonic() - start,
            "body": response.content.decode()}

token = {"HTTP_AUTHORIZATION": "Bearer bwu_000000000000.secret"}
for line in sys.stdin:
    if line.strip() == "wait-ready":
        start = time.monotonic()
        while get("/readyz")["status"] != 200 and time.monotonic() - start < 20:
            time.sleep(0.1)
        print(json.dumps({"ready_after": time.monotonic() - start}), flush=True)
    else:
        print(json.dumps({"readyz": get("/readyz"), "healthz": get("/healthz"),
                          "api": get("/api/v1/environments", **token),
                          "agent": get("/api/v1/agent/desired",
                                       HTTP_AUTHORIZATION="Bearer bwa_000000000000.s")}),
              flush=True)
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
        private_postgres.stop()
        down = ask("probe")
        private_postgres.start()
        started = time.monotonic()
        back = ask("wait-ready")
        resumed_after = time.monotonic() - started
    finally:
        probe.kill()
        probe.wait()

    for name in ("readyz", "api", "agent"):
        answer = down[name]
        assert answer["status"] == 503, (name, answer)
        assert json.loads(answer["body"])["error"]["code"] == "unavailable", (name, answer)
        assert answer["seconds"] < 2, (name, answer)
    assert json.loads(down["readyz"]["body"])["error"]["details"][0]["dependency"] == "database"
    assert down["healthz"]["status"] == 200
    assert back["ready_after"] < 2 and resumed_after < 2, (back, resumed_after)
