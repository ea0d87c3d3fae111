"""A stalled Redis (its process stopped with SIGSTOP) never holds a caller longer
than REDIS_TIMEOUT_S: the cache, the channel layer and the broker give up, each in
a process configured exactly as production configures it (settings from the
environment); agentapi's batched reads (apps.fleet.cache._AsyncRedis) give
up within two (a read asked while one is in flight waits for it first) and send
the request to Django."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Warms every client up (connections open), says so, waits for the stall, then
# times one call of each kind.
PROBE = r"""
import asyncio, json, sys, time
import django
django.setup()
from django.core.cache import caches
from channels.layers import get_channel_layer
from project.celery import app
from apps.fleet import cache as fleet_cache
from apps.fleet.tasks import heartbeats_flush_task

cache = caches["default"]
layer = get_channel_layer()
cache.set("probe", 1)
asyncio.run(layer.group_send("probe", {"type": "probe"}))
with app.connection_for_write() as conn:
    conn.ensure_connection(max_retries=1)
print("warm", flush=True)
sys.stdin.readline()

def timed(call):
    start = time.monotonic()
    try:
        call()
        outcome = "ok"
    except Exception as exc:
        outcome = type(exc).__name__
    return {"seconds": time.monotonic() - start, "outcome": outcome}

async def batched_reads():
    # Two waves of polls: the second asked while the first's MGET is in flight.
    first = [asyncio.create_task(fleet_cache.poll_state_async(f"key{i:08d}"))
             for i in range(50)]
    await asyncio.sleep(0.5)
    second = [fleet_cache.poll_state_async(f"late{i:08d}") for i in range(50)]
    states = await asyncio.gather(*first, *second)
    if any(state is not None for state in states):
        raise AssertionError("a poll state came from a stalled Redis")
    raise ConnectionError("every poll goes to Django")

print(json.dumps({
    "cache": timed(lambda: cache.get("probe")),
    "channel_layer": timed(lambda: asyncio.run(layer.group_send("probe", {"type": "probe"}))),
    "broker": timed(lambda: heartbeats_flush_task.delay()),
    "batched_reads": timed(lambda: asyncio.run(batched_reads())),
}), flush=True)
"""


def test_a_stalled_redis_holds_no_call_longer_than_its_timeout(private_redis, tmp_path):
    environ = {key: value for key, value in os.environ.items()
               if key not in {"DATABASE_URL", "CELERY_TASK_ALWAYS_EAGER"}}
    environ.update(REDIS_URL=private_redis.url, REDIS_TIMEOUT_S="2",
                   BELLWETHER_VAR_DIR=str(tmp_path / "var"),
                   DJANGO_SETTINGS_MODULE="project.settings")
    probe = subprocess.Popen([sys.executable, "-c", PROBE], cwd=ROOT, env=environ,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert probe.stdout.readline().strip() == "warm"
        with private_redis.stalled():
            probe.stdin.write("go\n")
            probe.stdin.flush()
            timings = json.loads(probe.stdout.readline())
    finally:
        probe.kill()
        probe.wait()

    # Each call failed rather than waited; a publish is tried at most twice.
    assert {name: t["outcome"] for name, t in timings.items() if t["outcome"] == "ok"} == {}
    assert timings["batched_reads"]["outcome"] == "ConnectionError", timings
    assert timings["cache"]["seconds"] < 3, timings
    assert timings["channel_layer"]["seconds"] < 3, timings
    assert timings["broker"]["seconds"] < 2 * 2 + 1, timings
    assert timings["batched_reads"]["seconds"] < 2 * 2 + 1, timings
