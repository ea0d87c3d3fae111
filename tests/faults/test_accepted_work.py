"""Work accepted while the broker (Redis) is sick is never lost, and never answered
500: a publish answers 202 and an agent's report 201 within a few seconds whether
Redis is stalled (SIGSTOP) or stopped. The committed rows are the record of the work
(a publication rendering, a rollout active), which beat's sweeps queue again.

The broker message leaves from a sender thread after the commit, so the request
never waits on the broker. Run in a process configured as production configures
it (settings from the environment; its own SQLite database, the private Redis as
broker, cache and channel layer). Its test client has no serving event loop, so
each live event it sends waits up to REDIS_TIMEOUT_S (2 s) for the stalled Redis;
under Daphne those are sent from the serving loop and hold no request."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = r"""
import json, sys, time
import django
django.setup()
from tests import agentroutes
agentroutes.install()  # the agents' routes through the ASGI stack, as served
from django.core.management import call_command
from apps.snapshots.models import Publication
from apps.rollouts.models import Rollout
from tests import factories

call_command("migrate", verbosity=0)
root = factories.superuser()
environment = factories.environment(
    factories.application(factories.tenant(actor=root), actor=root), actor=root,
    templates=factories.SHOP_TEMPLATES)
first = factories.publish(environment, root)
agents = factories.enrolled_agents(environment, 3, actor=root)
second = factories.publish_variant(environment, root, workers=8)
rollout = factories.start_rollout(environment, second, agents[:1], actor=root)
operator = factories.bearer_client(factories.api_token(root)[1])
reporters = [factories.bearer_client(a.token) for a in agents]
print("ready", flush=True)

def timed(client, path, body=None):
    started = time.monotonic()
    response = client.post(path, body, format="json")
    return {"status": response.status_code, "seconds": time.monotonic() - started,
            "body": response.content.decode()[:300]}

for index, line in enumerate(sys.stdin):
    publish = timed(operator, "/api/v1/environments/shop/prod/publish")
    report = timed(reporters[index], "/api/v1/agent/reports", {
        "deployment_id": None, "snapshot": second.number, "checksum": second.checksum,
        "status": "succeeded", "message": f"applied ({line.strip()})"})
    print(json.dumps({
        "publish": publish, "report": report,
        "rendering": Publication.objects.filter(state="rendering").count(),
        "rollout_active": Rollout.objects.filter(pk=rollout.pk, state="running").exists(),
    }), flush=True)
"""


def test_publish_and_report_answer_2xx_promptly_while_redis_is_stalled_then_down(
        private_redis, tmp_path):
    environ = {key: value for key, value in os.environ.items()
               if key not in {"DATABASE_URL", "CELERY_TASK_ALWAYS_EAGER"}}
    environ.update(REDIS_URL=private_redis.url, REDIS_TIMEOUT_S="2",
                   BELLWETHER_VAR_DIR=str(tmp_path / "var"), ALLOWED_HOSTS="testserver",
                   DJANGO_SETTINGS_MODULE="project.settings")
    probe = subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, env=environ,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(what: str) -> dict:
        probe.stdin.write(what + "\n")
        probe.stdin.flush()
        return json.loads(probe.stdout.readline())

    try:
        assert probe.stdout.readline().strip() == "ready"
        with private_redis.stalled():
            stalled = ask("stalled")
        private_redis.terminate()
        down = ask("down")
    finally:
        probe.kill()
        probe.wait()

    for name, answers in (("stalled", stalled), ("down", down)):
        assert answers["publish"]["status"] == 202, (name, answers)
        assert answers["report"]["status"] == 201, (name, answers)
        # Each Redis call gives up after REDIS_TIMEOUT_S; no request hangs on it.
        assert answers["publish"]["seconds"] < 5, (name, answers)
        assert answers["report"]["seconds"] < 5, (name, answers)
        assert answers["rollout_active"], (name, answers)  # beat reconciles it
    # Both publications are recorded, rendering: beat's sweep queues their renders.
    assert (stalled["rendering"], down["rendering"]) == (1, 2), (stalled, down)
