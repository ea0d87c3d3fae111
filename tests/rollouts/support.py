"""Helpers of the rollout tests: reading a rollout back, the operator's transitions
at the rollout's current version, and what the pins and targets say."""

from apps.fleet.models import Agent
from apps.rollouts import services
from apps.rollouts.models import Rollout, RolloutTarget


def fresh(rollout: Rollout) -> Rollout:
    return Rollout.objects.select_related("snapshot", "environment").get(pk=rollout.pk)


def confirm(rollout: Rollout, actor=None) -> Rollout:
    return services.rollout_confirm(rollout=rollout, actor=actor,
                                    expected_version=fresh(rollout).version)


def rollback(rollout: Rollout, actor=None, reason: str = "") -> Rollout:
    return services.rollout_rollback(rollout=rollout, actor=actor, reason=reason,
                                     expected_version=fresh(rollout).version)


def release(node_or_agent, rollout: Rollout, actor=None) -> Agent:
    agent = Agent.objects.get(pk=getattr(node_or_agent, "pk", node_or_agent))
    return services.rollout_pin_release(agent=agent, rollout=rollout, actor=actor,
                                        expected_generation=agent.generation)


def pins(nodes) -> dict[str, tuple[int | None, int | None]]:
    """agent name -> (pinned snapshot number, pinning rollout id)."""
    rows = Agent.objects.filter(pk__in=[n.pk for n in nodes]).values_list(
        "name", "pinned_snapshot__number", "pin_rollout_id")
    return {name: (number, rollout) for name, number, rollout in rows}


def target_states(rollout: Rollout) -> dict[str, str]:
    return dict(RolloutTarget.objects.filter(rollout=rollout)
                .values_list("agent__name", "state"))


def waves_of(rollout: Rollout) -> dict[int, list[str]]:
    waves: dict[int, list[str]] = {}
    for name, wave in (RolloutTarget.objects.filter(rollout=rollout)
                       .order_by("wave", "agent__name").values_list("agent__name", "wave")):
        waves.setdefault(wave, []).append(name)
    return waves
