"""The scheduler's absence is visible: a real `celery beat` records that it runs;
once it is gone for two reconcile intervals the API's running rollout, the
dashboard and /metrics say "waiting for the scheduler since …", and once it runs
again they stop saying so. A web node (granian, as the unit runs it) answers, on a
Redis of the test's own (beat's broker)."""

from __future__ import annotations

import re
import time
import urllib.request
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings

from apps.core.models import SchedulerBeat
from apps.core.scheduler import late_after
from tests import factories
from tests.e2e.harness import CeleryProcess, Server, free_port, http_json, wait_for
from tests.e2e.test_production_server import SERVER_SECRET_KEY

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

WAITING = re.compile(r"^waiting for the scheduler since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC")


def seen_at():
    return SchedulerBeat.objects.values_list("seen_at", flat=True).first()


def test_a_stopped_scheduler_is_named_by_the_api_the_dashboard_and_metrics(
        processes, server_environ, redis_server, running_rollout, superuser, tmp_path):
    environ = {**{k: v for k, v in server_environ.items() if k != "CELERY_TASK_ALWAYS_EAGER"},
               "REDIS_URL": redis_server.url, "SECRET_KEY": SERVER_SECRET_KEY}
    node = Server.production(port=free_port(), env=environ, log_path=tmp_path / "node.log")
    processes.append(node)
    node.start().wait_ready()
    _, token = factories.api_token(superuser)
    with override_settings(SECRET_KEY=SERVER_SECRET_KEY):  # the session as the node signs it
        session = factories.session_client(superuser).cookies[
            settings.SESSION_COOKIE_NAME].value
    rollout_url = f"{node.url}/api/v1/rollouts/{running_rollout.pk}"

    def reason() -> str:
        status, body = http_json("GET", rollout_url, token=token)
        assert status == 200, body
        return body["reason"]

    def page() -> str:
        request = urllib.request.Request(
            f"{node.url}/", headers={"Cookie": f"{settings.SESSION_COOKIE_NAME}={session}"})
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.read().decode()

    def late_metric() -> str:
        with urllib.request.urlopen(f"{node.url}/metrics", timeout=10) as response:
            return re.search(r"^bellwether_scheduler_late (\S+)$", response.read().decode(),
                             re.M)[1]

    def start_beat(name: str) -> CeleryProcess:
        beat = CeleryProcess.beat(env=environ, log_path=tmp_path / f"{name}.log",
                                  state_root=tmp_path / name)
        processes.append(beat)
        return beat.start().wait_ready()

    beat = start_beat("beat")
    wait_for(lambda: (seen_at() is not None, seen_at()), what="beat to record that it runs")
    assert not WAITING.match(reason()) and late_metric() == "0.0"
    assert "Waiting for the scheduler" not in page()

    beat.stop()
    last = seen_at()
    time.sleep(1)
    assert seen_at() == last  # nothing records it any more
    # As two reconcile intervals later: the record is that old.
    SchedulerBeat.objects.update(seen_at=last - late_after() - timedelta(seconds=1))

    assert WAITING.match(reason()), reason()
    assert late_metric() == "1.0"
    assert "Waiting for the scheduler since" in page()

    start_beat("beat-again")
    wait_for(lambda: (not WAITING.match(reason()), reason()),
             what="the reason to stop naming the scheduler", timeout=20)
    assert late_metric() == "0.0"
    assert "Waiting for the scheduler" not in page()
