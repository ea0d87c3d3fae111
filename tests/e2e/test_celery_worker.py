"""Publishing through the API with a real Celery worker process rendering the snapshot.

The worker runs `celery -A project worker` on its own queue, against the same
PostgreSQL test database and Redis broker as this process; nothing runs inline.
"""

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import channels_redis.core
import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from apps.core.events import environment_group
from apps.snapshots.models import Publication, Snapshot
from apps.tenancy.models import Role
from project.celery import app as celery_app

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.redis,
    pytest.mark.django_db(transaction=True),
]

PROJECT_ROOT = Path(__file__).resolve().parents[2]
WORKER_READY_TIMEOUT_S = 60
RENDER_TIMEOUT_S = 30
TASK = re.escape("apps.releases.tasks.publication_render_task")


def _test_database_url() -> str:
    """The URL of the database pytest-django created, for the worker to share."""
    db = connection.settings_dict
    user = quote(db["USER"] or "", safe="")
    password = f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else ""
    host = db["HOST"] or "127.0.0.1"
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{user}{password}@{host}{port}/{db['NAME']}"


class Worker:
    def __init__(self, process: subprocess.Popen, log_path: Path, queue: str):
        self.process = process
        self.log_path = log_path
        self.queue = queue

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(
                    f"celery worker exited with {self.process.returncode}:\n{self.log()}"
                )
            if " ready." in self.log():
                return
            time.sleep(0.2)
        pytest.fail(f"celery worker not ready after {timeout_s} s:\n{self.log()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=15)


@pytest.fixture
def worker_queue():
    """Send tasks from this process to a queue of our own, through the broker."""
    queue = f"bellwether-e2e-{uuid.uuid4().hex[:12]}"
    conf = celery_app.conf
    previous = (conf.task_always_eager, conf.task_default_queue)
    conf.task_always_eager = False
    conf.task_default_queue = queue
    yield queue
    conf.task_always_eager, conf.task_default_queue = previous


@pytest.fixture
def celery_worker(transactional_db, worker_queue, tmp_path):
    yield from _worker(worker_queue, tmp_path)


@pytest.fixture
def json_logging_worker(transactional_db, worker_queue, tmp_path):
    yield from _worker(worker_queue, tmp_path, BELLWETHER_LOG_FORMAT="json")


def _worker(worker_queue, tmp_path, **extra_env):
    log_path = tmp_path / "worker.log"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "project.settings",
        "DATABASE_URL": _test_database_url(),
        "DATABASE_POOL": "0",
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": "e2e-worker-secret",
        "CELERY_TASK_DEFAULT_QUEUE": worker_queue,
        "CELERY_TASK_ALWAYS_EAGER": "0",
        "LOG_LEVEL": "INFO",
        "PYTHONUNBUFFERED": "1",
        **extra_env,
    }
    command = [
        sys.executable, "-m", "celery", "-A", "project", "worker",
        "--pool=solo", "--concurrency=1", "-Q", worker_queue, "-n", f"{worker_queue}@%h",
        "--loglevel=INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, cwd=PROJECT_ROOT, env=env, stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
        )
    worker = Worker(process, log_path, worker_queue)
    try:
        worker.wait_until_ready(WORKER_READY_TIMEOUT_S)
        yield worker
    finally:
        worker.stop()
        # Captured output is shown only when the test fails.
        print(f"---- celery worker log ({log_path}) ----\n{worker.log()}")


def _poll_until_finished(client, url: str, worker: Worker) -> dict:
    deadline = time.monotonic() + RENDER_TIMEOUT_S
    while time.monotonic() < deadline:
        response = client.get(url)
        assert response.status_code == 200, response.content
        if response.data["state"] != Publication.State.RENDERING:
            return response.data
        assert worker.process.poll() is None, f"worker died:\n{worker.log()}"
        time.sleep(0.2)
    pytest.fail(f"publication still rendering after {RENDER_TIMEOUT_S} s:\n{worker.log()}")


def test_publish_is_rendered_by_a_celery_worker(
    celery_worker, environment, member, api_client, caplog
):
    caplog.set_level(logging.INFO, logger="apps.snapshots")
    client = api_client(member(Role.DEPLOYER))

    response = client.post("/api/v1/environments/shop/prod/publish")

    assert response.status_code == 202, response.content
    assert response.data["state"] == Publication.State.RENDERING
    assert response.data["snapshot"] is None
    location = response["Location"]
    assert location == f"/api/v1/publications/{response.data['id']}"

    body = _poll_until_finished(client, location, celery_worker)

    assert body["state"] == Publication.State.READY, body
    assert body["deduplicated"] is False
    assert body["snapshot"]["number"] == 1
    assert body["snapshot"]["state"] == Snapshot.State.READY
    snapshot = Snapshot.objects.get(environment=environment, number=1)
    assert snapshot.state == Snapshot.State.READY
    assert snapshot.checksum == body["snapshot"]["checksum"]
    assert [f["path"] for f in snapshot.files] == ["nginx/shop.conf", "shop/app.json"]
    assert "server_name shop.example.com;" in snapshot.files[0]["content"]
    assert snapshot.files[1]["content"] == '{"log_level": "info", "workers": 4}\n'
    environment.refresh_from_db()
    assert environment.snapshot_counter == 1

    # The worker, not this process, ran the task and stored the snapshot.
    # (its log line of success comes after the snapshot it committed: wait for it)
    deadline = time.monotonic() + 10
    while True:
        log = celery_worker.log()
        received = re.findall(rf"Task {TASK}\[([0-9a-f-]+)\] received", log)
        succeeded = re.findall(
            rf"Task {TASK}\[([0-9a-f-]+)\] succeeded in [0-9.]+s: 'ready'", log)
        if succeeded or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(received) == 1 and succeeded == received, (received, succeeded, log)
    assert f"shop/prod #1 ({snapshot.label}) stored as ready" in log, log
    here = [r.getMessage() for r in caplog.records if r.name.startswith("apps.snapshots")]
    assert any(f"publication {body['id']} (publish) queued" in m for m in here), here
    assert not any("stored as" in m for m in here), here


def test_with_json_logs_the_worker_writes_a_json_object_a_line_naming_the_task(
    json_logging_worker, environment, member, api_client
):
    client = api_client(member(Role.DEPLOYER))
    response = client.post("/api/v1/environments/shop/prod/publish")
    assert response.status_code == 202, response.content
    body = _poll_until_finished(client, response["Location"], json_logging_worker)
    assert body["state"] == Publication.State.READY, body

    def stored_line():
        # Celery's start-up banner is printed, not logged; every log line is JSON.
        for line in json_logging_worker.log().splitlines():
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            if "stored as ready" in entry["message"]:
                return entry
        return None

    deadline = time.monotonic() + 10
    while (entry := stored_line()) is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert entry is not None, json_logging_worker.log()
    assert entry["level"] == "INFO" and entry["logger"] == "apps.snapshots.services"
    assert re.fullmatch(r"[0-9a-f-]{36}", entry["request_id"]), entry


def test_a_snapshot_rendered_by_the_worker_reaches_live_subscribers_through_redis(
    celery_worker, environment, member, api_client
):
    """The worker's on-commit event crosses processes through channels_redis: a
    socket on any web node hears that the snapshot exists."""
    layer = get_channel_layer()
    assert isinstance(layer, channels_redis.core.RedisChannelLayer), type(layer)
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(environment_group(environment.pk), channel)
    client = api_client(member(Role.DEPLOYER))

    response = client.post("/api/v1/environments/shop/prod/publish")
    assert response.status_code == 202, response.content
    _poll_until_finished(client, response["Location"], celery_worker)

    async def next_event():
        return await asyncio.wait_for(layer.receive(channel), RENDER_TIMEOUT_S)

    events = [async_to_sync(next_event)()["event"] for _ in range(3)]
    assert {"kind": "snapshot", "environment": environment.pk, "number": 1} in events, events
