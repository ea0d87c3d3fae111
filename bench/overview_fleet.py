"""Benchmark: the dashboard overview's fleet counts over N agents, counted from a
few columns with the sync rule computed by the database (apps.fleet.selectors
.with_sync, what the overview does), against the baseline of building every
agent's full status in Python (agents_with_desired + agent_status, what the
agents table does per row).

Migrates a fresh embedded SQLite database in a temporary directory, creates an
environment with an active snapshot and N agents (written in bulk; a third in
sync, a third behind, a third never applied; every one seen recently). Times
each way REPEAT times, checks both give the same counts, and prints the median
of each and their ratio.

    .venv/bin/python bench/overview_fleet.py [--agents 10000]
"""

import argparse
import statistics
import sys
import time
from collections import Counter

from fresh_db import report, run_child  # bench/ is on the path of its scripts

REPEAT = 5


def child(agents: int) -> dict:
    """Runs in the child process, against the temporary database."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    from apps.dashboard.selectors import fleet_bucket, overview_for
    from apps.environments.services import environment_create, environment_file_put
    from apps.fleet.models import Agent
    from apps.fleet.selectors import agent_status, agents_with_desired, last_seen
    from apps.releases.publishing import publication_complete
    from apps.releases.services import snapshot_publish
    from apps.tenancy.services import application_create, tenant_create

    call_command("migrate", verbosity=0)
    admin = get_user_model().objects.create_superuser("bench", "b@example.com", "bench-pass")
    tenant = tenant_create(name="Bench", slug="bench", actor=admin)
    app = application_create(tenant=tenant, name="bench", actor=admin)
    env = environment_create(application=app, name="prod", config="greeting: hello\n",
                             actor=admin)
    environment_file_put(environment=env, kind="template", path="app.conf",
                         text="greeting = {{ greeting }}\n", actor=admin)
    publication = snapshot_publish(environment=env, actor=admin)
    snapshot = publication_complete(publication_id=str(publication.pk)).snapshot
    now = timezone.now()
    Agent.objects.bulk_create([
        Agent(environment=env, name=f"agent-{i}", token_key=f"b{i:015d}", token_hash="0" * 64,
              last_seen_at=now,
              applied_number=None if i % 3 == 2 else snapshot.number,
              applied_checksum="" if i % 3 == 2 else
              (snapshot.checksum if i % 3 == 0 else "sha256:" + "0" * 64))
        for i in range(agents)], batch_size=2000)

    def counted_in_sql() -> dict:
        return overview_for(admin)[0]["fleet"]

    def built_in_python() -> dict:
        rows = list(agents_with_desired(Agent.objects.filter(environment=env)))
        seen = last_seen(rows)
        counts = Counter()
        for agent in rows:
            status = agent_status(agent, seen.get(agent.pk))
            counts[fleet_bucket(status["online"], status["sync"])] += 1
        return {bucket: counts[bucket]
                for bucket in ("in_sync", "held", "behind", "failed", "offline")}

    timings = {}
    results = {}
    for name, way in (("sql", counted_in_sql), ("python", built_in_python)):
        runs = []
        for _ in range(REPEAT):
            started = time.perf_counter()
            results[name] = way()
            runs.append(time.perf_counter() - started)
        timings[name] = statistics.median(runs)
    assert results["sql"] == results["python"], results
    return {"agents": agents, "counts": results["sql"], "seconds": timings}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10_000,
                        help="agents in the environment (default 10000)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents < 3:
        parser.error("--agents must be at least 3")
    if args.child:
        report(child(args.agents))
        return 0

    result = run_child(__file__, ["--agents", str(args.agents)])
    if result is None:
        return 1

    sql, python = result["seconds"]["sql"], result["seconds"]["python"]
    print(f"{result['agents']} agents, embedded SQLite, one process, median of {REPEAT}")
    print(f"  counts: {result['counts']}")
    print(f"  overview (sync in SQL, a few columns):     {sql * 1000:7.1f} ms")
    print(f"  baseline (full status per agent, Python):  {python * 1000:7.1f} ms")
    print(f"ratio (baseline / overview): {python / sql:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
