"""What this process counts for Prometheus (served by /metrics, project/metrics.py).

Counters of events a web process sees — agent polls by outcome, agent reports by
status, live websocket connections. What the database already knows (publications,
rollouts and their waves, the queue) is read at each scrape instead, so every web
node and the worker agree on it. With PROMETHEUS_MULTIPROC_DIR set (several worker
processes behind one port), prometheus_client keeps these in files there and
/metrics adds them up.
"""

import functools

from prometheus_client import Counter, Gauge

POLLS = Counter("bellwether_agent_polls", "Agent polls of their desired state, by outcome",
                ["outcome"])
POLLS_FROM_DATABASE = Counter(
    "bellwether_agent_polls_from_database",
    "Agent polls answered from the database, not the cache, by why "
    "(agentapi.cached.Uncached)",
    ["reason"])
REPORTS = Counter("bellwether_agent_reports", "Agent reports accepted, by the status reported",
                  ["status"])
WEBSOCKETS = Gauge("bellwether_websocket_connections", "Live dashboard sockets open",
                   multiprocess_mode="livesum")

_OUTCOMES = {200: "changed", 304: "unchanged", 400: "bad_request", 401: "refused",
             403: "refused", 429: "throttled"}


def poll_outcome(status: int) -> str:
    """What a poll's HTTP status means to an operator: unchanged (304), changed
    (200: a new desired state or the first poll), refused (bad credentials),
    throttled, bad_request, unavailable (5xx: a dependency down) or other."""
    if status >= 500:
        return "unavailable"
    return _OUTCOMES.get(status, "other")


@functools.cache
def _polls(outcome: str):
    """The poll counter's child for `outcome`, looked up once (agentapi counts every poll)."""
    return POLLS.labels(outcome)


def poll_answered(status: int) -> None:
    _polls(poll_outcome(status)).inc()


def poll_from_database(reason: str) -> None:
    POLLS_FROM_DATABASE.labels(reason).inc()


def report_accepted(status: str) -> None:
    REPORTS.labels(status).inc()
