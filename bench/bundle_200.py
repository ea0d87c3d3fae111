"""Benchmark: a ~100 KB bundle's 200 (gzip negotiated) against the poll's 304, same server.

Starts one granian worker as the README's "Production shape" runs it (the project's
ASGI app: the agents' routes in front of Django, default middleware) over a fresh database
with one environment whose template renders a ~100 KB file (an nginx-like
upstream list with varied addresses: it compresses like a real config, not like
repeated text), publishes it and enrolls one agent, then alternates wrk runs of
  poll 304   GET /api/v1/agent/desired              (Authorization, matching If-None-Match)
  bundle 200 GET /api/v1/agent/snapshots/1/bundle   (Authorization, Accept-Encoding: gzip)
and prints requests/second of each, the bundle's size raw and as sent, and the
ratio bundle / poll (goal >= 0.5). The rounds interleave, so load from anything
else on the machine falls on both sides alike. With --from-database a third run
per round asks for the bundle with a query string (`?from=database`, which the
route ignores but answers from the database: a token query and the snapshot's row
on a thread each time).

    .venv/bin/python bench/bundle_200.py [--duration 10] [--rounds 3] [--connections 32]
        [--kilobytes 100] [--redis redis://127.0.0.1:6379/9] [--ports 18900-18999]
        [--from-database]

Needs wrk (apt-get install wrk). The per-agent API throttle is off in the server
it starts: every request here carries the one agent's token.
"""

import argparse
import random
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchserver import BenchServers  # noqa: E402
from fleet import port_range  # noqa: E402

TEMPLATE = """{% for u in upstreams %}upstream {{ u.name }} {
    server {{ u.address }}:{{ u.port }} weight={{ u.weight }} max_fails=3 fail_timeout=10s;
}
{% endfor %}"""


def config_text(kilobytes: int) -> str:
    """YAML whose upstream list renders to about `kilobytes` KB (~95 bytes each)."""
    rng = random.Random(14)
    lines = ["upstreams:"]
    for i in range(kilobytes * 1024 // 95):
        lines.append(f"  - {{name: svc-{i:05d}-{rng.choice(['api', 'web', 'db', 'cache'])}, "
                     f"address: 10.{rng.randrange(256)}.{rng.randrange(256)}."
                     f"{rng.randrange(1, 255)}, port: {rng.randrange(1024, 65535)}, "
                     f"weight: {rng.randrange(1, 10)}}}")
    return "\n".join(lines) + "\n"


def get(url: str, headers: dict):
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request) as response:
        return response.headers, response.read()


def wrk(url: str, headers: dict, duration: int, connections: int) -> float:
    command = ["wrk", "-t2", f"-c{connections}", f"-d{duration}s"]
    for name, value in headers.items():
        command += ["-H", f"{name}: {value}"]
    out = subprocess.run(command + [url], capture_output=True, text=True, check=True).stdout
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise SystemExit(f"{url}: {errors[1]} error responses\n{out}")
    return float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])


def enroll(base: str, enrollment_token: str) -> str:
    body = f'{{"enrollment_token": "{enrollment_token}", "name": "bench", "labels": {{}}}}'
    request = urllib.request.Request(f"{base}/api/v1/agent/enroll", data=body.encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request) as response:
        return re.search(r'"token":\s*"([^"]+)"', response.read().decode())[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--rounds", type=int, default=3, help="alternating runs of each")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--kilobytes", type=int, default=100, help="the bundle's file size")
    parser.add_argument("--redis", default="", help="REDIS_URL for the cache "
                                                    "(default: local memory)")
    parser.add_argument("--ports", type=port_range, help="a port for the server from A-B")
    parser.add_argument("--from-database", action="store_true",
                        help="also measure the bundle answered from the database")
    args = parser.parse_args()
    if not shutil.which("wrk"):
        parser.error("wrk is not installed (apt-get install wrk)")
    if not (1 <= args.kilobytes <= 1000 and 1 <= args.rounds <= 20 and 1 <= args.duration <= 600):
        parser.error("--kilobytes 1-1000, --rounds 1-20, --duration 1-600")
    with BenchServers(redis_url=args.redis, ports=args.ports, server="granian") as servers:
        servers.setup(uses=1, config=config_text(args.kilobytes), template=TEMPLATE)
        servers.start()
        base = servers.urls[0]
        auth = {"Authorization": f"Bearer {enroll(base, servers.enrollment_token)}"}
        headers, _ = get(f"{base}/api/v1/agent/desired", auth)  # warms the cache entry
        poll = (f"{base}/api/v1/agent/desired", {**auth, "If-None-Match": headers["ETag"]})
        bundle = (f"{base}/api/v1/agent/snapshots/1/bundle", {**auth, "Accept-Encoding": "gzip"})
        sent_headers, sent = get(*bundle)
        if sent_headers.get("Content-Encoding") != "gzip":
            raise SystemExit("the bundle was not sent gzip-compressed")
        _, raw = get(bundle[0], auth)
        polls, bundles, from_database = [], [], []
        for _ in range(args.rounds):
            polls.append(wrk(*poll, args.duration, args.connections))
            bundles.append(wrk(*bundle, args.duration, args.connections))
            if args.from_database:
                from_database.append(wrk(bundle[0] + "?from=database", bundle[1],
                                         args.duration, args.connections))
    print(f"cache: {'redis' if args.redis else 'local memory'}; {args.rounds} x "
          f"{args.duration}s interleaved, {args.connections} connections, one granian worker")
    print(f"bundle: {len(raw) / 1024:.1f} KiB JSON, {len(sent) / 1024:.1f} KiB as sent (gzip)")
    print(f"poll 304   req/s: {', '.join(f'{r:.0f}' for r in polls)}")
    print(f"bundle 200 req/s: {', '.join(f'{r:.0f}' for r in bundles)}")
    if from_database:
        shown = ", ".join(f"{r:.0f}" for r in from_database)
        print(f"bundle 200 from the database req/s: {shown}")
    print(f"ratio (best bundle / best poll): {max(bundles) / max(polls):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
