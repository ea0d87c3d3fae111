"""A worker killed with SIGKILL in the middle of a render loses nothing: the
publication (the outbox of its render) says it is rendering since the claim, and
once the claim outlives the render's hard limit, beat's sweep queues the render
again and a new worker finishes it — within a minute of the kill.

Real processes: two `celery worker`s in turn (prefork, renders slowed by a
test-only shim) and a `celery beat` with the production schedule, on a queue of
this test's own, against the test database."""

import os
import signal
import sys
import time
import uuid

import pytest
from django.conf import settings

from apps.snapshots.models import Publication
from apps.tenancy.models import Role
from project.celery import app as celery_app
from tests.e2e.harness import Process, shared_database_url, wait_for

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.django_db(transaction=True)]

TASK = "apps.releases.tasks.publication_render_task"


@pytest.fixture
def queue():
    name = f"bellwether-e2e-{uuid.uuid4().hex[:12]}"
    conf = celery_app.conf
    previous = (conf.task_always_eager, conf.task_default_queue)
    conf.task_always_eager, conf.task_default_queue = False, name
    yield name
    conf.task_always_eager, conf.task_default_queue = previous


@pytest.fixture
def celery_environ(queue) -> dict:
    return {**os.environ, "DJANGO_SETTINGS_MODULE": "project.settings",
            "DATABASE_URL": shared_database_url(), "DATABASE_POOL": "0",
            "REDIS_URL": settings.REDIS_URL, "SECRET_KEY": "e2e-worker-secret",
            "CELERY_TASK_DEFAULT_QUEUE": queue, "CELERY_TASK_ALWAYS_EAGER": "0",
            # The shortest render limit there may be: a dead claim is one 15 s old.
            "BELLWETHER_RENDER_TIME_LIMIT_S": "10",
            "LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}


def start_worker(processes, environ, queue, tmp_path, name: str, delay_s: float) -> Process:
    worker = Process(f"worker {name}", [
        sys.executable, "-m", "tests.e2e.slow_render_worker", "-A", "project", "worker",
        "--pool=prefork", "--concurrency=1", "-Q", queue, "-n", f"{name}-{queue}@%h",
        "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ], {**environ, "BELLWETHER_TEST_RENDER_DELAY_S": str(delay_s)},
        tmp_path / f"worker-{name}.log")
    processes.append(worker)
    worker.start()
    wait_for(lambda: (" ready." in worker.log(), worker.log()[-2000:]),
             what=f"worker {name} ready", timeout=60)
    return worker


def test_a_render_whose_worker_was_killed_completes_within_a_minute(
        processes, celery_environ, queue, tmp_path, environment, member, api_client):
    first = start_worker(processes, celery_environ, queue, tmp_path, "first", delay_s=120)
    client = api_client(member(Role.DEPLOYER))

    response = client.post("/api/v1/environments/shop/prod/publish")
    assert response.status_code == 202, response.content
    location = response["Location"]
    claimed = wait_for(
        lambda: ((body := client.get(location).data)["claimed_at"] is not None, body),
        what="the first worker's claim", timeout=30, diagnostics=first.dump)
    assert claimed["state"] == "rendering"
    assert claimed["progress"].startswith("rendering since "), claimed

    os.killpg(first.process.pid, signal.SIGKILL)  # the worker and its pool, mid-render
    first.process.wait(10)
    killed_at = time.monotonic()
    assert client.get(location).data["state"] == "rendering"

    second = start_worker(processes, celery_environ, queue, tmp_path, "second", delay_s=1)
    beat = Process("beat", [sys.executable, "-m", "celery", "-A", "project", "beat",
                            "--loglevel=INFO", "-s", str(tmp_path / "beat-schedule")],
                   celery_environ, tmp_path / "beat.log")
    processes.append(beat)
    beat.start()

    def diagnostics() -> str:
        return "\n".join(p.dump() for p in (first, second, beat))

    finished = wait_for(
        lambda: ((body := client.get(location).data)["state"] != "rendering", body),
        what="the publication to finish", timeout=75, interval=0.5, diagnostics=diagnostics)
    took = time.monotonic() - killed_at

    assert finished["state"] == "ready", finished
    assert finished["snapshot"]["number"] == 1 and finished["progress"] is None
    assert took < 60, f"finished {took:.1f} s after the kill\n{diagnostics()}"
    publication = Publication.objects.get(pk=claimed["id"])
    assert publication.claimed_at.isoformat() != claimed["claimed_at"]  # claimed anew
    # The sweep (sent by beat, run by the new worker) queued the render again.
    assert f"publication {publication.pk} still rendering; queueing it again" in second.log()
    assert "Sending due task reconcile-publications" in beat.log()
    assert f"Task {TASK}" in second.log() and "succeeded" in second.log(), diagnostics()
    print(f"publication finished {took:.1f} s after its worker was killed")
