"""Benchmark: poll latency in the seconds after a publish against the steady state.

N plain pollers (bench/fleet.py's simulated agents: enroll, GET
/api/v1/agent/desired with If-None-Match every --interval seconds, fetch the
bundle and report when the desired snapshot changes) against granian web nodes
(the README's production server, the agents' routes in front of Django) over
PostgreSQL + Redis, long-poll off (BELLWETHER_LONG_POLL_MAX_S=0). Once every agent
has reported snapshot #1 and polled again, the script records the latency of
every desired GET for --steady seconds, then changes the config and publishes
it through the API, and records on: it prints min/p50/p90/p99/max of

- **steady**: the polls started in the --steady seconds before the publish,
- **after publish**: the polls started in the --after seconds after it,

their ratio (after / steady p99, the stampede) and the load average before and
after. A failed poll counts as taking its timeout.

    .venv/bin/python bench/stampede.py --agents 1000 --interval 5-10 \\
        --database-url postgres://postgres@127.0.0.1:5432/DB --redis-url redis://127.0.0.1:6379/N \\
        [--nodes 1] [--workers 2] [--poll-nodes 0] [--steady 30] [--after 10] \\
        [--ports 19100-19199]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchserver import APPLICATION, ENVIRONMENT, BenchServers  # noqa: E402
from fleet import (  # noqa: E402
    TEMPLATE,
    Connection,
    Fleet,
    SimulatedAgent,
    active_number,
    api,
    enroll_all,
    interval,
    port_range,
    raise_fd_limit,
    ranks,
    record_lag,
    wait_until,
)

DESIRED = "/api/v1/agent/desired"
POLL_TIMEOUT_S = 30.0


class GranianServers(BenchServers):
    """BenchServers with granian web nodes (README's production shape), whose
    workers are stopped with them."""

    def stop(self) -> None:
        """granian's workers outlive their terminated main process: end them too."""
        workers = []
        for process in self.web:
            with contextlib.suppress(OSError):
                workers += Path(f"/proc/{process.pid}/task/{process.pid}/children"
                                ).read_text().split()
        super().stop()
        for pid in workers:
            with contextlib.suppress(OSError):
                os.kill(int(pid), signal.SIGKILL)

    def _wait_ready(self, url: str) -> None:
        for attempt in range(4):  # a loaded machine starts workers slowly
            try:
                return super()._wait_ready(url)
            except SystemExit:
                if attempt == 3 or any(p.poll() is not None for p in self.web):
                    raise
        return None


class TimedConnection(Connection):
    """A connection that records (start, seconds, status) of every desired GET."""

    def __init__(self, url: str, samples: list):
        super().__init__(url)
        self.samples = samples

    async def request(self, method, path, **kwargs):
        if not path.startswith(DESIRED):
            return await super().request(method, path, **kwargs)
        started = time.monotonic()
        try:
            answer = await super().request(method, path, **kwargs)
        except Exception:
            self.samples.append((started, POLL_TIMEOUT_S, "error"))
            raise
        # Answers from the database carry a request id; the cache's never do.
        source = " from the database" if "x-request-id" in answer[1] else ""
        self.samples.append((started, time.monotonic() - started, f"{answer[0]}{source}"))
        return answer


class RoutedConnection(TimedConnection):
    """Desired GETs to a poll node, every other request to an app node: a load
    balancer routing the poll's path to a pool of its own (--poll-nodes)."""

    def __init__(self, poll_url: str, app_url: str, samples: list):
        super().__init__(app_url, samples)
        self.polls = TimedConnection(poll_url, samples)

    async def request(self, method, path, **kwargs):
        if path.startswith(DESIRED):
            return await self.polls.request(method, path, **kwargs)
        return await super().request(method, path, **kwargs)

    def close(self):
        self.polls.close()
        super().close()


def connection_for(index: int, urls: list[str], poll_nodes: int, samples: list):
    """Agent `index`'s connection: to one node, or with --poll-nodes K its polls to
    one of the first K nodes and the rest to one of the others."""
    if not poll_nodes:
        return TimedConnection(urls[index % len(urls)], samples)
    polls, apps = urls[:poll_nodes], urls[poll_nodes:]
    return RoutedConnection(polls[index % len(polls)], apps[index % len(apps)], samples)


def window(samples, start: float, end: float) -> tuple[dict, int, dict]:
    """Latency ranks (ms), count and statuses (each with its p99, ms) of the polls
    started in [start, end)."""
    chosen = [(seconds, status) for began, seconds, status in samples if start <= began < end]
    statuses: dict = {}
    for status in {status for _, status in chosen}:
        times = [s for s, kind in chosen if kind == status]
        statuses[status] = f"{len(times)} (p99 {ranks(times)['p99'] * 1000:.0f} ms)"
    return ({k: v * 1000 for k, v in ranks([s for s, _ in chosen]).items()}, len(chosen),
            statuses)


def lag_window(lags, start: float, end: float) -> float:
    """p99 of the simulator's lag in [start, end), ms."""
    return ranks([lag for at, lag in lags if start <= at < end])["p99"] * 1000


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def measure(args, urls: list[str], api_token: str, enrollment_token: str) -> dict:
    fleet, samples = Fleet(args), []
    env_path = f"/api/v1/environments/{APPLICATION}/{ENVIRONMENT}"
    app = urls[args.poll_nodes]  # where the API calls go
    fleet.baseline_number = await active_number(app, api_token, env_path,
                                                time.monotonic() + args.setup_timeout)
    agents = [SimulatedAgent(i, urls[i % len(urls)], fleet) for i in range(args.agents)]
    for agent in agents:
        agent.connection = connection_for(agent.index, urls, args.poll_nodes, samples)
    await enroll_all(agents, enrollment_token, args.enroll_concurrency, fleet)
    tasks = [asyncio.create_task(agent.run()) for agent in agents]
    lags: list = []
    tasks.append(asyncio.create_task(record_lag(lags)))
    if not await wait_until(lambda: len(fleet.synced) == args.agents,
                            time.monotonic() + args.setup_timeout):
        raise SystemExit(f"only {len(fleet.synced)} of {args.agents} agents synced within "
                         f"--setup-timeout; errors: {dict(fleet.errors)}")
    await asyncio.sleep(args.interval[1])  # every agent polled again: a warm cache
    load_before, steady_from = loadavg(), time.monotonic()
    await asyncio.sleep(args.steady)
    await api(app, api_token, "PATCH", env_path,
              {"config": f"generation: {fleet.baseline_number + 1}\n"})
    fleet.published_at = time.monotonic()
    published = await api(app, api_token, "POST", f"{env_path}/publish")
    publish_answer_s = fleet.since_publish()
    await asyncio.sleep(args.after)
    load_after = loadavg()
    with contextlib.suppress(TimeoutError):  # the polls of the window finish
        await asyncio.wait_for(fleet.all_reported.wait(), max(1.0, args.duration - args.after))
    await asyncio.sleep(min(POLL_TIMEOUT_S, 2.0))
    fleet.stopping = True
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for agent in agents:
        agent.connection.close()
    return {"fleet": fleet, "published": published, "publish_answer_s": publish_answer_s,
            "steady": window(samples, steady_from, fleet.published_at),
            "after": window(samples, fleet.published_at, fleet.published_at + args.after),
            "lag": (lag_window(lags, steady_from, fleet.published_at),
                    lag_window(lags, fleet.published_at, fleet.published_at + args.after)),
            "load": (load_before, load_after)}


def print_result(args, result: dict) -> int:
    fleet = result["fleet"]
    low, high = args.interval
    routing = (f", polls routed to {args.poll_nodes} of them" if args.poll_nodes else "")
    print(f"agents: {args.agents} plain pollers every {low:g}-{high:g} s; {args.nodes} granian "
          f"node(s) x {args.workers} worker(s){routing}, PostgreSQL + Redis")
    print(f"publish answered in {result['publish_answer_s']:.2f} s "
          f"({result['published'].get('state', '')}); reported "
          f"{len(fleet.reported)}/{args.agents}")
    for name, (ranked, count, statuses) in (("steady", result["steady"]),
                                            (f"{args.after:g} s after publish",
                                             result["after"])):
        print(f"{name}: {count} polls {json.dumps(statuses, sort_keys=True)}; "
              + ", ".join(f"{k} {v:.0f} ms" for k, v in ranked.items()))
    print(f"load average: {result['load'][0]} before, {result['load'][1]} after")
    print(f"simulator's own event-loop lag p99: {result['lag'][0]:.0f} ms steady, "
          f"{result['lag'][1]:.0f} ms after publish (included in every latency above)")
    errors = ", ".join(f"{kind}: {n}" for kind, n in fleet.errors.most_common())
    print(f"errors: {errors or 'none'}")
    steady, after = result["steady"][0]["p99"], result["after"][0]["p99"]
    print(f"ratio (p99 after publish / steady p99): {after:.0f} ms / {steady:.0f} ms = "
          f"{after / max(steady, 0.001):.1f}x")
    return 0 if len(fleet.reported) == args.agents else 1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--interval", type=interval, default=(5.0, 10.0),
                        help="seconds between polls, A or A-B (default 5-10)")
    parser.add_argument("--steady", type=float, default=30.0,
                        help="seconds of steady polls measured before the publish")
    parser.add_argument("--after", type=float, default=10.0,
                        help="seconds after the publish whose polls are measured")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds after the publish to wait for every report")
    parser.add_argument("--setup-timeout", type=float, default=600.0)
    parser.add_argument("--enroll-concurrency", type=int, default=16)
    parser.add_argument("--nodes", type=int, default=1, help="web nodes (1-4)")
    parser.add_argument("--workers", type=int, default=2, help="granian workers per node")
    parser.add_argument("--poll-nodes", type=int, default=0,
                        help="route desired GETs to the first K nodes and every other "
                             "request to the rest, as a load balancer routing the poll's "
                             "path to a pool of its own (default 0: no routing)")
    parser.add_argument("--database-url", required=True, help="PostgreSQL it may flush")
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--ports", type=port_range)
    args = parser.parse_args(argv)
    if not 1 <= args.agents <= 20_000 or not 1 <= args.nodes <= 4:
        parser.error("--agents 1-20000, --nodes 1-4")
    if not 0 <= args.poll_nodes < args.nodes:
        parser.error("--poll-nodes 0 to --nodes - 1 (the other nodes serve the rest)")
    args.wait = 1  # unused: the servers do not advertise long-poll
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    raise_fd_limit(args.agents)
    with GranianServers(server="granian", workers=args.workers, nodes=args.nodes,
                        database_url=args.database_url,
                        redis_url=args.redis_url, ports=args.ports,
                        extra_env={"BELLWETHER_LONG_POLL_MAX_S": "0",
                                   # the first sync of a large fleet on a loaded machine
                                   "DATABASE_POOL_TIMEOUT_S": "5"}) as servers:
        servers.setup(uses=args.agents, config="generation: 1\n", template=TEMPLATE)
        try:
            servers.start()
            result = asyncio.run(measure(args, servers.urls, servers.api_token,
                                         servers.enrollment_token))
        except SystemExit:
            sys.stderr.write(servers.log_tail())
            raise
        return print_result(args, result)


if __name__ == "__main__":
    sys.exit(main())
