"""Benchmark: a staged rollout's transitions over N agents, set-based, against a
naive loop that updates the same agents one query each.

Migrates a fresh database (embedded SQLite in a temporary directory, or with
--database-url a new PostgreSQL database on that server, dropped afterwards),
creates an environment with an active snapshot #1 and a staged #2, and N agents
(written in bulk). Then times, through the real services, counting queries:
  create    rollout_create: freeze every agent's pin, move the canaries (1 %)
  wave 1    confirm: 10 % of the agents move to #2
  wave 2    confirm: the rest move to #2
  complete  confirm: #2 becomes active, every pin is released
  rollback  a second rollout (#3), past its canaries, rolled back: #2 re-rendered
            as #4 and active, every pin released (its create is timed too)
Agents' acknowledgements between waves are written in bulk and not timed. Each
step is timed until it answers, and until its agents' poll answers are refilled
(on the refill thread after commit, apps.fleet.refill, as in production). The
baseline updates every agent's pin with its own UPDATE (one transaction), the
least a per-agent implementation would do. Prints seconds, queries and
microseconds per agent of each, and the per-agent ratio.

    .venv/bin/python bench/rollout_waves.py [--agents 10000]
        [--database-url postgres://USER@HOST:5432/DB] [--redis-url redis://HOST:6379/N]
"""

import argparse
import pstats
import sys
import time

from fresh_db import report, run_child  # bench/ is on the path of its scripts

# The steps child() times, in order (--profile names one).
STEPS = ("create", "wave 1", "wave 2", "complete", "create 2", "rollback")


def child(agents: int, profiled: str | None = None) -> dict:
    """Runs in the child process, against the temporary database."""
    import cProfile
    import os
    import tempfile

    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import connection, transaction
    from django.db.models import F
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from apps.environments.services import environment_create, environment_file_put
    from apps.fleet import refill
    from apps.fleet.models import Agent, Deployment
    from apps.releases.publishing import publication_complete
    from apps.releases.services import environment_update, snapshot_publish
    from apps.rollouts import services
    from apps.rollouts.models import Rollout, RolloutTarget
    from apps.tenancy.services import application_create, tenant_create

    call_command("migrate", verbosity=0)
    # The collector as in the processes that run rollouts (a web or worker process).
    from project import gc_tuning

    gc_tuning.install()
    # The rollout's own tasks run inline (no worker here), but the agents' poll
    # answers are refilled on the refill thread after each step commits, as in
    # production where tasks are not inline: a step is timed until it answers,
    # its refill until the answers are written.
    refill.tasks_inline = lambda: False
    admin = get_user_model().objects.create_superuser("bench", "b@example.com", "bench-pass")
    tenant = tenant_create(name="Bench", slug="bench", actor=admin)
    app = application_create(tenant=tenant, name="bench", actor=admin)
    env = environment_create(application=app, name="prod", config="greeting: hello\n",
                             actor=admin)
    environment_file_put(environment=env, kind="template", path="app.conf",
                         text="greeting = {{ greeting }}\n", actor=admin)

    def publish():
        publication = snapshot_publish(environment=env, actor=admin)
        return publication_complete(publication_id=str(publication.pk)).snapshot

    publish()  # 1, active
    env = environment_update(environment=env, release_policy="staged", actor=admin)
    env = environment_update(environment=env, config="greeting: hi\n", actor=admin)
    snapshot = publish()  # 2, staged
    env.refresh_from_db()

    Agent.objects.bulk_create([
        Agent(environment=env, name=f"agent-{i}", token_key=f"b{i:015d}", token_hash="0" * 64)
        for i in range(agents)], batch_size=2000)
    ids = list(Agent.objects.filter(environment=env).order_by("pk").values_list("pk", flat=True))
    canaries = ids[:max(1, agents // 100)]

    def acknowledge(rollout: Rollout, wave: int) -> None:
        now, snapshot = timezone.now(), rollout.snapshot
        wave_ids = list(RolloutTarget.objects.filter(rollout=rollout, wave=wave)
                        .values_list("agent_id", flat=True))
        Deployment.objects.bulk_create([
            Deployment(agent_id=i, snapshot=snapshot, kind=Deployment.Kind.PULL,
                       state=Deployment.State.SUCCEEDED, reported_checksum=snapshot.checksum,
                       reported_at=now) for i in wave_ids], batch_size=2000)
        Agent.objects.filter(pk__in=wave_ids).update(
            applied_number=snapshot.number, applied_checksum=snapshot.checksum,
            last_status="succeeded", last_report_at=now)

    steps = []

    profile = cProfile.Profile() if profiled else None

    def timed(step: str, touched: int, moved: int, action):
        assert step == STEPS[len(steps)], (step, STEPS)
        with CaptureQueriesContext(connection) as captured:
            if step == profiled:
                profile.enable()
            started = time.perf_counter()
            value = action()
            seconds = time.perf_counter() - started
            if step == profiled:
                profile.disable()
        assert refill.wait_until_refilled(300)
        refilled = time.perf_counter() - started
        slowest = sorted(captured.captured_queries, key=lambda q: -float(q["time"]))[:3]
        steps.append({"step": step, "agents": touched, "moved": moved, "seconds": seconds,
                      "refilled": refilled,
                      "queries": len(captured.captured_queries),
                      "sql_seconds": sum(float(q["time"]) for q in captured.captured_queries),
                      "slowest": [(q["time"], q["sql"][:300]) for q in slowest]})
        return value

    def start(snapshot):
        return services.rollout_create(
            environment=env, snapshot=snapshot, actor=admin, canary_agents=canaries,
            waves=[{"percent": 10, "gate": "manual"}, {"percent": 100, "gate": "manual"}])

    def fresh(rollout):
        return Rollout.objects.select_related("snapshot", "environment").get(pk=rollout.pk)

    def confirm(rollout):
        return services.rollout_confirm(rollout=rollout, expected_version=rollout.version,
                                        actor=admin)

    rollout = timed("create", agents, len(canaries), lambda: start(snapshot))
    for index in range(len(rollout.waves)):
        rollout = fresh(rollout)
        acknowledge(rollout, index)
        size = (rollout.waves[index + 1]["size"] if index + 1 < len(rollout.waves)
                else agents)
        name = f"wave {index + 1}" if index + 1 < len(rollout.waves) else "complete"
        rollout = timed(name, size, size, lambda r=rollout: confirm(r))
    assert rollout.state == "completed", rollout.state
    assert not Agent.objects.filter(pin_rollout__isnull=False).exists()

    env = environment_update(environment=env, config="greeting: hey\n", actor=admin)
    third = publish()  # 3, staged
    env.refresh_from_db()
    rollout = timed("create 2", agents, len(canaries), lambda: start(third))
    acknowledge(fresh(rollout), 0)
    rollout = confirm(fresh(rollout))
    rollout = fresh(rollout)
    rollout = timed("rollback", agents, len(canaries) + rollout.waves[1]["size"],
                    lambda: services.rollout_rollback(rollout=rollout, actor=admin,
                                                      expected_version=rollout.version))
    assert rollout.state == "rolled_back", rollout.state
    assert not Agent.objects.filter(pin_rollout__isnull=False).exists()

    started = time.perf_counter()
    with transaction.atomic():
        for agent_id in ids:
            Agent.objects.filter(pk=agent_id).update(
                pinned_snapshot=snapshot, pinned_at=timezone.now(),
                generation=F("generation") + 1)
    loop = time.perf_counter() - started
    stats = None
    if profiled:
        stats = os.path.join(tempfile.gettempdir(), f"rollout_waves-{os.getpid()}.pstats")
        profile.dump_stats(stats)
    return {"agents": agents, "steps": steps, "loop_seconds": loop, "profile": stats}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10_000,
                        help="agents in the rollout (default 10000; the default bound "
                             "BELLWETHER_ROLLOUT_MAX_TARGETS is 10000)")
    parser.add_argument("--database-url", help="a PostgreSQL server (and a database to "
                        "connect to) on which a fresh database is created for the run and "
                        "dropped after it; default: embedded SQLite")
    parser.add_argument("--redis-url", help="Redis as the cache (heartbeats, poll states), "
                        "as in production; default: none (local memory)")
    parser.add_argument("--verbose", action="store_true",
                        help="show each step's three slowest queries")
    parser.add_argument("--profile", metavar="STEP", choices=STEPS,
                        help="profile one step (cProfile; its time includes the "
                             "profiler's) and print its 25 costliest calls")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents < 3:
        parser.error("--agents must be at least 3")
    if args.child:
        report(child(args.agents, args.profile))
        return 0

    profiling = ["--profile", args.profile] if args.profile else []
    result = run_child(__file__, ["--agents", str(args.agents), *profiling],
                       extra_env={"BELLWETHER_ROLLOUT_MAX_TARGETS":
                                  str(max(args.agents, 10_000))},
                       database_url=args.database_url, redis_url=args.redis_url)
    if result is None:
        return 1

    agents = result["agents"]
    database = "PostgreSQL" if args.database_url else "embedded SQLite"
    cache = "Redis" if args.redis_url else "local-memory"
    print(f"{agents} agents, {database}, {cache} cache, one process")
    for step in result["steps"]:
        per_agent = step["seconds"] / step["agents"] * 1e6
        print(f"  {step['step']:<9} {step['seconds']:7.3f} s  {step['queries']:>3} queries  "
              f"{step['moved']:>6} pins moved, {step['agents']:>6} touched  "
              f"{per_agent:8.1f} us/agent  (poll answers refilled at "
              f"{step['refilled']:.3f} s)")
        if args.verbose:
            print(f"      {step['sql_seconds']:.3f} s in the database's answers")
            for seconds, sql in step["slowest"]:
                print(f"      {seconds} s  {sql}")
    transitions = [s for s in result["steps"] if s["step"].startswith(("wave", "complete"))]
    set_based = sum(s["seconds"] for s in transitions)
    set_agents = sum(s["agents"] for s in transitions)
    set_per_agent = set_based / set_agents * 1e6
    loop_per_agent = result["loop_seconds"] / agents * 1e6
    print(f"set-based wave transitions: {set_based:.2f} s for {set_agents} agent moves "
          f"({set_per_agent:.1f} us/agent)")
    print(f"per-agent loop (one UPDATE each): {result['loop_seconds']:.2f} s for {agents} "
          f"agents ({loop_per_agent:.1f} us/agent)")
    print(f"ratio (per-agent loop / set-based, per agent): {loop_per_agent / set_per_agent:.0f}x")
    if result["profile"]:
        print(f"profile of {args.profile} ({result['profile']}):")
        pstats.Stats(result["profile"]).sort_stats("cumulative").print_stats(25)
    return 0


if __name__ == "__main__":
    sys.exit(main())
