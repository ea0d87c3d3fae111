"""Benchmark: a simulated fleet, from one publish to every agent notified and reported.

N simulated agents (asyncio, one keep-alive HTTP/1.1 connection each, through
bench/simhttp.py) speak the agent protocol of docs/design.md as agent/client.py
does: enroll with an enrollment token, GET /api/v1/agent/desired with If-None-Match,
fetch the bundle (Accept-Encoding: gzip) when the desired snapshot changes, POST a
report. When a desired answer carries `Bellwether-Long-Poll: <max s>`, an agent
long-polls (`?wait=N`, N = min(--wait, max)); otherwise it polls every --interval
seconds (a range A-B: each wait drawn uniformly from it). Once every agent has
reported the first snapshot, one publish (the API, an owner's API token) changes the
environment; the script measures publish -> every agent notified (saw the new
desired state) and publish -> every agent reported: min/p50/p90/p99/max, errors by
kind, and the web nodes' resident memory (before the agents, once a tenth of them
are held, with all of them held, after): its growth per held agent from before the
agents (the servers' own warm-up included) and between a tenth and all of them held
(what each more waiting agent costs), and the polls the servers answered from the
database, by why (their /metrics: bellwether_agent_polls_from_database), before and
after the publish.

    .venv/bin/python bench/fleet.py --agents 500 [--interval 1-5] [--wait 30]
        [--nodes 2 --database-url postgres://... --redis-url redis://...]
        [--duration 60] [--ports 18900-18999] [--workers 2] [--ramp 60]
        [--poll-workers 2]
    .venv/bin/python bench/fleet.py --url http://host:8000 [--url ...] --api-token T \
        --enrollment-token E --environment APP/ENV [--server-pid PID ...]

Without --url it starts the servers itself in a temporary directory: granian as
README "Production shape" runs it (--server daphne for the old shape), embedded
SQLite with tasks inline, or with --database-url/--redis-url (the database is
flushed) --nodes web nodes of --workers processes sharing them plus a Celery worker
and beat; agents are spread over the nodes round-robin, and enroll evenly over
--ramp seconds (a fleet is rolled out over time), retrying as the agent does.
With --poll-workers N each node has an agent node beside it (granian, N
processes) and the agents talk to it, as a load balancer routes the agents' API
to the agents' pool (docs/operations.md); the API's publish goes to the web node,
and the memory printed is both servers'.
Everything is bounded: --agents, the setup (--setup-timeout) and the wait for
reports after the publish (--duration).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import gzip
import json
import os
import random
import resource
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchserver import APPLICATION, ENVIRONMENT, BenchServers, rss_kib  # noqa: E402
from simhttp import Connection  # noqa: E402

MAX_AGENTS = 20_000
ENROLL_ATTEMPTS = 5
TEMPLATE = "generation = {{ generation }}\n"


class HttpError(Exception):
    """An answer the protocol does not expect; its kind names the call, the status
    and the error envelope's code."""

    def __init__(self, call: str, status: int, body: bytes = b""):
        try:
            code = " " + json.loads(body)["error"]["code"]
        except (ValueError, KeyError, TypeError):
            code = ""
        self.kind = f"{call} HTTP {status}{code}"
        super().__init__(self.kind)


class Fleet:
    """What the agents share: the measurement's clock and its results."""

    def __init__(self, args):
        self.args = args
        self.published_at: float | None = None  # time.monotonic() of the publish request
        self.baseline_number = 0  # the snapshot every agent applied before the publish
        self.notified: dict[int, float] = {}  # agent -> seconds after the publish
        self.bundled: dict[int, float] = {}  # agent -> its new bundle received
        self.reported: dict[int, float] = {}
        self.synced: set[int] = set()  # agents that reported the baseline snapshot
        self.waiting = 0  # long-polls held by the server right now
        self.errors: Counter = Counter()
        self.stopping = False
        self.all_reported = asyncio.Event()

    def since_publish(self) -> float:
        return time.monotonic() - self.published_at


class SimulatedAgent:
    def __init__(self, index: int, url: str, fleet: Fleet):
        self.index, self.fleet = index, fleet
        self.connection = Connection(url)
        self.token = self.etag = ""
        self.active: tuple | None = None  # (number, checksum) applied
        self.wait_s = 0  # > 0 once the server advertised long-poll

    def _auth(self) -> dict:
        return {"Authorization": f"Bearer {self.token}"}

    async def enroll(self, enrollment_token: str) -> None:
        body = json.dumps({"enrollment_token": enrollment_token, "labels": {"sim": "1"},
                           "name": f"sim-{self.index:05d}"}).encode()
        status, _, answer = await self.connection.request("POST", "/api/v1/agent/enroll",
                                                          body=body)
        if status != 201:
            raise HttpError("enroll", status, answer)
        self.token = json.loads(answer)["token"]

    async def poll(self) -> None:
        """One conditional GET of the desired state (held by the server when
        long-polling); applies and reports what changed."""
        headers = self._auth()
        if self.etag:
            headers["If-None-Match"] = self.etag
        path, timeout = "/api/v1/agent/desired", 30.0
        held = bool(self.wait_s and self.etag)
        if held:
            path, timeout = f"{path}?wait={self.wait_s}", self.wait_s + 15.0
            self.fleet.waiting += 1
        try:
            status, answer, body = await self.connection.request(
                "GET", path, headers=headers, timeout=timeout)
        finally:
            self.fleet.waiting -= held
        advertised = answer.get("bellwether-long-poll")
        if advertised and advertised.isdigit():
            self.wait_s = min(self.fleet.args.wait, int(advertised))
        elif status == 200:
            self.wait_s = 0  # not advertised (any more): plain polling
        if status == 304:
            return
        if status != 200:
            raise HttpError("desired", status, body)
        await self._apply(json.loads(body), answer.get("etag", ""))

    async def _apply(self, desired: dict, etag: str) -> None:
        fleet, snapshot = self.fleet, desired.get("snapshot")
        if snapshot is None or (snapshot["number"], snapshot["checksum"]) == self.active:
            self.etag = etag
            return
        number, checksum = snapshot["number"], snapshot["checksum"]
        is_the_publish = fleet.published_at is not None and number > fleet.baseline_number
        if is_the_publish:
            fleet.notified.setdefault(self.index, fleet.since_publish())
        status, headers, body = await self.connection.request(
            "GET", snapshot["bundle_url"], headers={**self._auth(), "Accept-Encoding": "gzip"})
        if status != 200:
            raise HttpError("bundle", status, body)
        if headers.get("content-encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
        if is_the_publish:
            fleet.bundled.setdefault(self.index, fleet.since_publish())
        bundle = json.loads(body)
        if (bundle.get("number"), bundle.get("checksum")) != (number, checksum):
            raise HttpError("bundle not the announced snapshot", 200)
        report = {"deployment_id": desired.get("deployment_id"), "snapshot": number,
                  "checksum": checksum, "status": "succeeded", "message": "fleet simulator"}
        status, _, answer = await self.connection.request(
            "POST", "/api/v1/agent/reports", headers=self._auth(),
            body=json.dumps(report).encode())
        if status not in (200, 201):
            raise HttpError("report", status, answer)
        self.active, self.etag = (number, checksum), etag
        if is_the_publish:
            fleet.reported.setdefault(self.index, fleet.since_publish())
            if len(fleet.reported) == fleet.args.agents:
                fleet.all_reported.set()
        elif number == fleet.baseline_number:
            fleet.synced.add(self.index)

    async def run(self) -> None:
        """Poll until the fleet stops; errors are counted by kind and backed off from
        with jitter, as the agent does."""
        failures = 0
        while not self.fleet.stopping:
            try:
                if not (self.wait_s and self.etag):
                    await asyncio.sleep(random.uniform(*self.fleet.args.interval))
                await self.poll()
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - every failure is a measured error
                self.fleet.errors[error_kind(exc)] += 1
                failures += 1
                await asyncio.sleep(min(30.0, 2.0 ** failures) * random.uniform(0.5, 1.0))


def error_kind(exc: BaseException) -> str:
    if isinstance(exc, HttpError):
        return exc.kind
    if isinstance(exc, TimeoutError):
        return "timeout"
    return type(exc).__name__


def ranks(values: list[float]) -> dict[str, float]:
    """min, p50, p90, p99 (nearest rank) and max of `values` (0 for none)."""
    ordered = sorted(values) or [0.0]

    def rank(p: float) -> float:
        return ordered[max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))]
    return {"min": ordered[0], "p50": rank(50), "p90": rank(90), "p99": rank(99),
            "max": ordered[-1]}


LAG_TICK_S = 0.01


async def record_lag(lags: list) -> None:
    """The simulator's own lateness (start, seconds): how much later than asked a
    10 ms sleep of its event loop ends. The agents share the machine's cores with
    the servers; every time measured includes this lag."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(LAG_TICK_S)
        lags.append((time.monotonic(), loop.time() - started - LAG_TICK_S))


def percentiles(values: list[float]) -> str:
    if not values:
        return "-"
    return ", ".join(f"{name} {value:.2f} s" for name, value in ranks(values).items())


async def api(url: str, token: str, method: str, path: str, body: dict | None = None):
    connection = Connection(url)
    try:
        status, _, answer = await connection.request(
            method, path, headers={"Authorization": f"Bearer {token}"},
            body=None if body is None else json.dumps(body).encode())
    finally:
        connection.close()
    if status >= 300:
        raise SystemExit(f"{method} {path}: HTTP {status} {answer[:300]!r}")
    return json.loads(answer) if answer else {}


async def active_number(url: str, token: str, env_path: str, deadline: float) -> int:
    """The environment's active snapshot number, once there is one (a worker may
    still be rendering the first)."""
    while True:
        active = (await api(url, token, "GET", env_path))["active_snapshot"]
        if active:
            return active["number"]
        if time.monotonic() > deadline:
            raise SystemExit(f"{env_path} has no active snapshot (direct, published once?)")
        await asyncio.sleep(0.2)


async def enroll_all(agents, enrollment_token: str, concurrency: int, fleet: Fleet,
                     ramp_s: float = 0.0, then=None) -> None:
    """Enroll every agent, at most `concurrency` at once, agent i not before i/N of
    `ramp_s` (a fleet is rolled out over time, not in one second); `then(agent)`
    runs as soon as an agent is enrolled (its polling). One that cannot enroll is an
    error that stops the benchmark."""
    gate, started = asyncio.Semaphore(concurrency), time.monotonic()
    async def one(index, agent):
        await asyncio.sleep(max(0.0, started + ramp_s * index / len(agents) - time.monotonic()))
        for attempt in range(1, ENROLL_ATTEMPTS + 1):  # as the agent retries
            async with gate:
                try:
                    await agent.enroll(enrollment_token)
                    break
                except Exception as exc:  # noqa: BLE001
                    fleet.errors["enroll " + error_kind(exc)] += 1
            await asyncio.sleep(min(30.0, 2.0 ** attempt) * random.uniform(0.5, 1.0))
        else:
            return
        if then is not None:
            then(agent)
    await asyncio.gather(*(one(index, agent) for index, agent in enumerate(agents)))
    if not all(agent.token for agent in agents):
        raise SystemExit(f"enrollment failed: {dict(fleet.errors)}")


async def _held_rss(fleet: Fleet, count: int, rss) -> tuple[int, list]:
    """(agents held, the servers' RSS) once `count` agents are held, enrollment going
    on: with the later sample of all of them, the memory each more waiting agent
    costs, apart from what warming the servers up costs once."""
    await wait_until(lambda: fleet.waiting >= count, float("inf"), step=0.2)
    return fleet.waiting, rss()


def polls_from_database(url: str) -> Counter | None:
    """The polls the servers answered from the database so far, by why, as the web node
    at `url` counts them (every process of BenchServers shares one
    PROMETHEUS_MULTIPROC_DIR, so one node's /metrics counts all); None when it does
    not say (/metrics not open to this address, an older server)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=30) as answer:
            text = answer.read().decode()
    except OSError:
        return None
    return Counter({sample.labels["reason"]: int(sample.value)
                    for family in text_string_to_metric_families(text)
                    if family.name == "bellwether_agent_polls_from_database"
                    for sample in family.samples if sample.name.endswith("_total")})


async def wait_until(predicate, deadline: float, step: float = 0.05) -> bool:
    while not predicate():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(step)
    return True


async def measure(args, urls: list[str], api_token: str, enrollment_token: str,
                  environment: str, rss, poll_urls: list[str] = ()) -> dict:
    fleet = Fleet(args)
    application, _, env_name = environment.partition("/")
    env_path = f"/api/v1/environments/{application}/{env_name}"
    fleet.baseline_number = await active_number(urls[0], api_token, env_path,
                                                time.monotonic() + args.setup_timeout)
    agent_urls = poll_urls or urls  # the agents' own pool when there is one
    agents = [SimulatedAgent(i, agent_urls[i % len(agent_urls)], fleet)
              for i in range(args.agents)]
    rss_idle = rss()
    started = time.monotonic()
    tasks = []
    warm = asyncio.create_task(_held_rss(fleet, args.agents // 10, rss))
    await enroll_all(agents, enrollment_token, args.enroll_concurrency, fleet, args.ramp,
                     then=lambda agent: tasks.append(asyncio.create_task(agent.run())))
    enrolled_s = time.monotonic() - started
    setup_deadline = started + args.setup_timeout
    if not await wait_until(lambda: len(fleet.synced) == args.agents, setup_deadline):
        raise SystemExit(f"only {len(fleet.synced)} of {args.agents} agents synced within "
                         f"--setup-timeout; errors: {dict(fleet.errors)}")
    synced_s = time.monotonic() - started
    # Steady state: every plain poller has polled again; every long-poller is held.
    await asyncio.sleep(args.interval[1])
    await wait_until(lambda: fleet.waiting == args.agents or not agents[0].wait_s,
                     time.monotonic() + 10)
    rss_steady, setup_errors = rss(), Counter(fleet.errors)
    held = (fleet.waiting, rss_steady)
    rss_warm = warm.result() if warm.done() else None
    warm.cancel()
    load_at_publish = Path("/proc/loadavg").read_text().split()[:3]
    to_django_before = await asyncio.to_thread(polls_from_database, urls[0])
    long_polling = sum(1 for agent in agents if agent.wait_s)
    if args.change_config:
        await api(urls[0], api_token, "PATCH", env_path,
                  {"config": f"generation: {fleet.baseline_number + 1}\n"})
    if args.on_publish:  # e.g. a profiler attached to the servers for the storm
        subprocess.Popen(args.on_publish, shell=True)  # noqa: S602 - the operator's own
    cpu_before, lags = cpu_seconds(), []
    lag = asyncio.create_task(record_lag(lags))
    fleet.published_at = time.monotonic()
    published = await api(urls[0], api_token, "POST", f"{env_path}/publish")
    publish_answer_s = fleet.since_publish()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(fleet.all_reported.wait(), args.duration)
    (simulator, machine, by_name), wall = cpu_seconds(), fleet.since_publish()
    cpu = (simulator - cpu_before[0], machine - cpu_before[1], wall, by_name - cpu_before[2])
    lag.cancel()
    fleet.stopping = True
    rss_after = rss()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for agent in agents:
        agent.connection.close()
    to_django = await asyncio.to_thread(polls_from_database, urls[0])
    return {"fleet": fleet, "enrolled_s": enrolled_s, "synced_s": synced_s,
            "long_polling": long_polling, "publish_answer_s": publish_answer_s,
            "published": published, "rss": (rss_idle, rss_steady, rss_after),
            "held_rss": (rss_warm, held),
            "setup_errors": setup_errors, "load": load_at_publish, "cpu": cpu,
            "lag": ranks([seconds for _, seconds in lags]),
            "to_django": (to_django_before, to_django)}


def cpu_seconds() -> tuple[float, float, Counter]:
    """(this simulator's CPU seconds, the whole machine's busy CPU seconds, CPU
    seconds by process name: which server took the machine)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    tick = os.sysconf("SC_CLK_TCK")
    return (usage.ru_utime + usage.ru_stime, (sum(fields[:8]) - idle) / tick,
            Counter({name: ticks / tick for name, ticks in cpu_by_name().items()}))


def cpu_by_name() -> Counter:
    """Clock ticks spent so far by the live processes, by what they are: granian
    (the web workers), celery, the simulator, else the command's name (postgres,
    redis-server, ...)."""
    ticks: Counter = Counter()
    for process in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, ValueError):
            text = (process / "stat").read_text()
            command = (process / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            name = next((known for known in ("granian", "celery", "daphne",
                                             "fleet.py")
                         if known in command), text[text.index("(") + 1:text.rindex(")")])
            fields = text[text.rindex(")") + 2:].split()
            ticks[name] += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks


def print_result(args, result: dict, nodes: int) -> int:
    fleet, agents = result["fleet"], args.agents
    low, high = args.interval
    mode = (f"long-poll (wait {args.wait} s) for {result['long_polling']} of {agents}"
            if result["long_polling"] else f"plain polling every {low:g}-{high:g} s")
    pool = (f" and {nodes} agent node(s) of {args.poll_workers} process(es) serving the "
            f"agents" if args.poll_workers else "")
    print(f"agents: {agents} on {nodes} web node(s){pool}; {mode}")
    print(f"enrolled in {result['enrolled_s']:.1f} s, all synced at "
          f"{result['synced_s']:.1f} s; publish answered in {result['publish_answer_s']:.2f} s "
          f"({result['published'].get('state', '')} activates="
          f"{result['published'].get('activates', '?')})")
    print(f"publish -> notified ({len(fleet.notified)}/{agents}): "
          f"{percentiles(list(fleet.notified.values()))}")
    print(f"publish -> bundle received ({len(fleet.bundled)}/{agents}): "
          f"{percentiles(list(fleet.bundled.values()))}")
    print(f"publish -> reported ({len(fleet.reported)}/{agents}): "
          f"{percentiles(list(fleet.reported.values()))}")
    idle, steady, after = result["rss"]
    if idle:
        per_agent = (sum(steady) - sum(idle)) / agents
        print(f"server RSS (KiB, per node): before agents {idle}, with agents {steady}, "
              f"after publish {after}; growth per connected agent {per_agent:.1f} KiB")
        warm, (held, _) = result["held_rss"]
        if warm and held > warm[0]:
            per_held = (sum(steady) - sum(warm[1])) / (held - warm[0])
            print(f"server RSS with {warm[0]} agents held {warm[1]}, with {held} {steady}: "
                  f"{per_held:.1f} KiB per more waiting agent")
    print(f"load average at the publish: {' '.join(result['load'])}")
    simulator, machine, wall, by_name = result["cpu"]
    print(f"CPU from the publish to the last report ({wall:.1f} s, {os.cpu_count()} cores): "
          f"the simulator {simulator:.1f} s, the whole machine {machine:.1f} s "
          f"(servers, database, Redis and simulator); by process: " + ", ".join(
              f"{name} {seconds:.1f} s" for name, seconds in by_name.most_common(6)))
    lag = result["lag"]
    print(f"the simulator's own event-loop lag from the publish to the last report: "
          f"p50 {lag['p50'] * 1000:.0f} ms, p99 {lag['p99'] * 1000:.0f} ms, "
          f"max {lag['max'] * 1000:.0f} ms (included in every time above)")
    before, after = result["to_django"]
    if before is not None and after is not None:
        print("polls answered from the database, by why: before the publish "
              f"{dict(before.most_common()) or 'none'}; after it "
              f"{dict((after - before).most_common()) or 'none'}")
    if result["setup_errors"]:
        print("errors before the publish (enrollment, first sync): " + ", ".join(
            f"{kind}: {n}" for kind, n in result["setup_errors"].most_common()))
    after = fleet.errors - result["setup_errors"]
    errors = ", ".join(f"{kind}: {n}" for kind, n in after.most_common())
    print(f"errors: {errors or 'none'}")
    return 0 if len(fleet.reported) == agents else 1


def interval(text: str) -> tuple[float, float]:
    low, _, high = text.partition("-")
    bounds = (float(low), float(high or low))
    if not 0 < bounds[0] <= bounds[1] <= 600:
        raise argparse.ArgumentTypeError("expected seconds A or A-B, 0 < A <= B <= 600")
    return bounds


def port_range(text: str) -> list[int]:
    low, _, high = text.partition("-")
    return list(range(int(low), int(high or low) + 1))


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=500)
    parser.add_argument("--interval", type=interval, default=(1.0, 5.0),
                        help="plain polling: seconds between polls, A or A-B (default 1-5)")
    parser.add_argument("--wait", type=int, default=30,
                        help="long-poll: ?wait=N, at most what the server advertises")
    parser.add_argument("--duration", type=float, default=60.0,
                        help="seconds after the publish to wait for every report")
    parser.add_argument("--setup-timeout", type=float, default=300.0,
                        help="seconds to enroll the fleet and see every agent synced")
    parser.add_argument("--enroll-concurrency", type=int, default=16)
    parser.add_argument("--on-publish", metavar="COMMAND",
                        help="a shell command started (not waited for) just before the "
                             "publish, e.g. a profiler attached to the servers")
    parser.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                        help="the simulator's event loop (default uvloop: lighter, so more "
                             "of the machine is left to the servers)")
    parser.add_argument("--ramp", type=float, default=0.0,
                        help="seconds over which the agents enroll (and first sync), evenly")
    parser.add_argument("--nodes", type=int, default=1, help="web nodes to start (1-4)")
    parser.add_argument("--workers", type=int, default=1,
                        help="granian: worker processes per web node (1-4)")
    parser.add_argument("--poll-workers", type=int, default=0,
                        help="an agent node (granian) of this many processes beside each "
                             "web node, serving the agents' API as the agents' pool does "
                             "(docs/operations.md); 0: none, agents talk to the web nodes")
    parser.add_argument("--server", choices=("granian", "daphne"), default="granian",
                        help="the web server it starts (default granian, as in production)")
    parser.add_argument("--database-url", default="",
                        help="PostgreSQL the benchmark may flush (default: embedded SQLite)")
    parser.add_argument("--redis-url", default="", help="Redis for cache, broker, channels")
    parser.add_argument("--ports", type=port_range, help="ports for the web nodes, A-B")
    parser.add_argument("--agent-rate", default="600/minute", metavar="RATE",
                        help="each agent's API rate in the servers it starts (default "
                             "600/minute, the servers' own default: agentapi counts it in "
                             "Redis for every bundle and report; 'off' counts nothing)")
    parser.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting for the servers it starts, e.g. DATABASE_POOL_SIZE=20")
    parser.add_argument("--url", action="append", default=[],
                        help="a running server instead (repeat for several nodes)")
    parser.add_argument("--api-token", help="with --url: an owner's API token")
    parser.add_argument("--enrollment-token", help="with --url: enough uses for --agents")
    parser.add_argument("--environment", help="with --url: APP/ENV (direct, published once)")
    parser.add_argument("--server-pid", type=int, action="append", default=[],
                        help="with --url: web node processes whose memory to read")
    args = parser.parse_args(argv)
    if not 1 <= args.agents <= MAX_AGENTS:
        parser.error(f"--agents must be between 1 and {MAX_AGENTS}")
    if not (1 <= args.nodes <= 4 and 1 <= args.workers <= 4 and 0 <= args.poll_workers <= 4):
        parser.error("--nodes and --workers must be between 1 and 4, --poll-workers 0-4")
    if not 0 <= args.ramp <= 3600:
        parser.error("--ramp is seconds, at most 3600")
    if not (0 < args.duration <= 3600 and 0 < args.setup_timeout <= 3600):
        parser.error("--duration and --setup-timeout are seconds, at most 3600")
    if not 1 <= args.wait <= 300:
        parser.error("--wait must be between 1 and 300")
    if any("=" not in item for item in args.server_env):
        parser.error("--server-env takes NAME=VALUE")
    args.server_env = {"BELLWETHER_THROTTLE_AGENT": args.agent_rate,
                       **dict(item.split("=", 1) for item in args.server_env)}
    if args.url and args.poll_workers:
        parser.error("--poll-workers starts agent nodes: not with --url")
    if args.url and not (args.api_token and args.enrollment_token and args.environment):
        parser.error("--url needs --api-token, --enrollment-token and --environment")
    return args


def run(args, coroutine):
    """Run the simulation on uvloop (--loop uvloop, the default: the simulator shares
    the machine with the servers, so it should take as little of it as it can) or
    asyncio's own loop."""
    if args.loop == "uvloop":
        import uvloop

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(coroutine)
    return asyncio.run(coroutine)


def raise_fd_limit(agents: int) -> None:
    """Each agent holds a connection (and the server its other end, when local)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * agents + 1024
    if soft < wanted:
        limit = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))


def main(argv=None) -> int:
    args = parse_args(argv)
    raise_fd_limit(args.agents)  # before the servers start: they inherit it
    # Ten thousand agents' connections and coroutines are a heap the default
    # collector walks whole every few thousand requests: collect as the servers do
    # (project/gc_tuning.py), so the simulator takes less of the machine they share.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    if args.url:
        args.change_config = False  # not ours to change: the publish alone makes a number
        result = run(args, measure(args, args.url, args.api_token, args.enrollment_token,
                                   args.environment,
                                   lambda: [rss_kib(pid) for pid in args.server_pid]))
        return print_result(args, result, len(args.url))
    args.change_config = True
    with BenchServers(nodes=args.nodes, database_url=args.database_url,
                      redis_url=args.redis_url, ports=args.ports,
                      extra_env=args.server_env, server=args.server,
                      workers=args.workers, poll_workers=args.poll_workers) as servers:
        servers.setup(uses=args.agents, config="generation: 1\n", template=TEMPLATE)
        try:
            servers.start()
            result = run(args, measure(args, servers.urls, servers.api_token,
                                       servers.enrollment_token,
                                       f"{APPLICATION}/{ENVIRONMENT}", servers.rss_kib,
                                       servers.poll_urls))
        except SystemExit:
            sys.stderr.write(servers.log_tail())
            raise
        return print_result(args, result, args.nodes)


if __name__ == "__main__":
    sys.exit(main())
