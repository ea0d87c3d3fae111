"""Benchmark: a staged rollout's transitions over N agents, set-based, against a
naive loop that updates the same agents one query each.

Migrates a fresh embedded SQLite database in a temporary directory, creates an
environment with an active snapshot #1 and a staged #2, and N agents (written
in bulk). Then times, through the real services:
  create    rollout_create: freeze every agent's pin, move the canaries (1 %)
  wave 1    confirm: 10 % of the agents move to #2
  wave 2    confirm: the rest move to #2
  complete  confirm: #2 becomes active, every pin is released
Agents' acknowledgements between waves are written in bulk and not timed. The
baseline updates every agent's pin with its own UPDATE (one transaction), the
least a per-agent implementation would do. Prints seconds and microseconds per
agent of each, and the per-agent ratio.

    .venv/bin/python bench/rollout_waves.py [--agents 10000]
"""

import argparse
import sys
import time

from fresh_db import report, run_child  # bench/ is on the path of its scripts


def child(agents: int) -> dict:
    """Runs in the child process, against the temporary database."""
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.db import transaction
    from django.db.models import F
    from django.utils import timezone

    from apps.environments.services import environment_create, environment_file_put
    from apps.fleet.models import Agent, Deployment
    from apps.releases.publishing import publication_complete
    from apps.releases.services import environment_update, snapshot_publish
    from apps.rollouts import services
    from apps.rollouts.models import Rollout, RolloutTarget
    from apps.tenancy.services import application_create, tenant_create

    call_command("migrate", verbosity=0)
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
        now = timezone.now()
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
    started = time.perf_counter()
    rollout = services.rollout_create(
        environment=env, snapshot=snapshot, actor=admin, canary_agents=canaries,
        waves=[{"percent": 10, "gate": "manual"}, {"percent": 100, "gate": "manual"}])
    steps.append({"step": "create", "agents": agents, "moved": len(canaries),
                  "seconds": time.perf_counter() - started})
    for index in range(len(rollout.waves)):
        rollout = Rollout.objects.select_related("snapshot", "environment").get(pk=rollout.pk)
        acknowledge(rollout, index)
        size = (rollout.waves[index + 1]["size"] if index + 1 < len(rollout.waves)
                else agents)
        started = time.perf_counter()
        rollout = services.rollout_confirm(rollout=rollout, expected_version=rollout.version,
                                           actor=admin)
        name = f"wave {index + 1}" if index + 1 < len(rollout.waves) else "complete"
        steps.append({"step": name, "agents": size, "moved": size,
                      "seconds": time.perf_counter() - started})
    assert rollout.state == "completed", rollout.state
    assert not Agent.objects.filter(pin_rollout__isnull=False).exists()

    started = time.perf_counter()
    with transaction.atomic():
        for agent_id in ids:
            Agent.objects.filter(pk=agent_id).update(
                pinned_snapshot=snapshot, pinned_at=timezone.now(),
                generation=F("generation") + 1)
    loop = time.perf_counter() - started
    return {"agents": agents, "steps": steps, "loop_seconds": loop}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10_000,
                        help="agents in the rollout (default 10000; the default bound "
                             "BELLWETHER_ROLLOUT_MAX_TARGETS is 10000)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.agents < 3:
        parser.error("--agents must be at least 3")
    if args.child:
        report(child(args.agents))
        return 0

    result = run_child(__file__, ["--agents", str(args.agents)],
                       extra_env={"BELLWETHER_ROLLOUT_MAX_TARGETS":
                                  str(max(args.agents, 10_000))})
    if result is None:
        return 1

    agents = result["agents"]
    print(f"{agents} agents, embedded SQLite, one process")
    for step in result["steps"]:
        per_agent = step["seconds"] / step["agents"] * 1e6
        print(f"  {step['step']:<9} {step['seconds']:7.3f} s  {step['moved']:>6} pins moved, "
              f"{step['agents']:>6} touched  {per_agent:8.1f} us/agent")
    transitions = [s for s in result["steps"] if s["step"] != "create"]
    set_based = sum(s["seconds"] for s in transitions)
    set_agents = sum(s["agents"] for s in transitions)
    set_per_agent = set_based / set_agents * 1e6
    loop_per_agent = result["loop_seconds"] / agents * 1e6
    print(f"set-based wave transitions: {set_based:.2f} s for {set_agents} agent moves "
          f"({set_per_agent:.1f} us/agent)")
    print(f"per-agent loop (one UPDATE each): {result['loop_seconds']:.2f} s for {agents} "
          f"agents ({loop_per_agent:.1f} us/agent)")
    print(f"ratio (per-agent loop / set-based, per agent): {loop_per_agent / set_per_agent:.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
