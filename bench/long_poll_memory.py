"""Benchmark: the memory one held long-poll costs the production server.

Starts the production shape (one granian worker serving project.asgi, Redis as the
cache), creates an agent, opens N connections each holding
`GET /api/v1/agent/desired?wait=60` with a matching If-None-Match, and prints the
worker's resident memory before and after, per held poll.

    .venv/bin/python bench/long_poll_memory.py [--polls 5000] [--port 18805]
        [--redis redis://127.0.0.1:6379/9]

Needs an open-file limit above --polls (ulimit -n).
"""

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import poll_304


def worker_rss_kb(server: subprocess.Popen) -> int:
    children = subprocess.run(["pgrep", "-P", str(server.pid)], capture_output=True,
                              text=True).stdout.split()
    total = 0
    for pid in children:
        with open(f"/proc/{pid}/status") as status:
            total += int(re.search(r"VmRSS:\s+(\d+)", status.read())[1])
    return total


async def hold(port: int, token: str, etag: str):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET /api/v1/agent/desired?wait=60 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 f"Authorization: Bearer {token}\r\nIf-None-Match: {etag}\r\n\r\n".encode())
    await writer.drain()
    return writer


async def measure(server, port: int, token: str, etag: str, polls: int) -> tuple[int, int]:
    warm = [await hold(port, token, etag) for _ in range(50)]  # one-time allocations
    await asyncio.sleep(2)
    before = worker_rss_kb(server)
    held = []
    for start in range(0, polls, 200):
        held += await asyncio.gather(*(hold(port, token, etag)
                                       for _ in range(min(200, polls - start))))
    await asyncio.sleep(3)
    after = worker_rss_kb(server)
    for writer in held + warm:
        writer.close()
    return before, after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--polls", type=int, default=5000)
    parser.add_argument("--port", type=int, default=18805)
    parser.add_argument("--redis", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    workdir = tempfile.mkdtemp(prefix="bellwether-bench-")
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="project.settings", DEBUG="0",
               SQLITE_PATH=os.path.join(workdir, "bench.sqlite3"), LOG_LEVEL="WARNING",
               CELERY_TASK_ALWAYS_EAGER="1", PYTHONPATH=str(poll_304.ROOT),
               ALLOWED_HOSTS="127.0.0.1", SECRET_KEY="bench-" + "x" * 60,
               SECURE_COOKIES="0", REDIS_URL=args.redis)
    env.pop("DATABASE_URL", None)
    token = poll_304.setup_data(env)
    try:
        server = poll_304.granian("asginl", "project.asgi:application", args.port, env)
        base = f"http://127.0.0.1:{args.port}"
        try:
            poll_304.wait_answering(f"{base}/healthz")
            request = urllib.request.Request(f"{base}/api/v1/agent/desired",
                                             headers={"Authorization": f"Bearer {token}"})
            with urllib.request.urlopen(request) as response:
                etag = response.headers["ETag"]
            before, after = asyncio.run(measure(server, args.port, token, etag, args.polls))
            per_poll = (after - before) * 1024 / args.polls
            print(f"{args.polls} held long-polls, one granian worker: RSS {before} kB -> "
                  f"{after} kB, {per_poll:,.0f} bytes per held poll")
        finally:
            poll_304.stop(server)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
