"""Rollouts and decommissioned agents: new rollouts skip them (or refuse to name
them), and decommissioning a target of a running rollout lets the wave go on."""

import pytest

from apps.core.errors import Conflict
from apps.fleet.models import Agent
from apps.releases import services as releases
from apps.rollouts import selectors
from apps.rollouts.models import RolloutTarget
from tests.factories import ack, start_rollout
from tests.rollouts.support import confirm, fresh, pins, target_states

pytestmark = pytest.mark.django_db

MANUAL_WAVES = [{"percent": 100, "gate": "manual"}]


def _decommission(node, actor=None) -> Agent:
    agent = Agent.objects.get(pk=node.pk)
    return releases.agent_decommission(agent=agent, expected_generation=agent.generation,
                                       actor=actor)


def test_a_new_rollout_skips_decommissioned_agents(environment, second, fleet):
    web1, web2, web3 = fleet(3)
    _decommission(web3)

    rollout = start_rollout(environment, second, [web1], waves=MANUAL_WAVES)

    assert target_states(rollout) == {"web-1": "activated", "web-2": "pending"}
    assert pins([web3]) == {"web-3": (None, None)}


def test_a_rollout_naming_a_decommissioned_agent_is_refused(environment, second, fleet):
    web1, web2 = fleet(2)
    _decommission(web2)

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web1], waves=MANUAL_WAVES,
                      targets=[{"agent": a.pk, "expected_generation": Agent.objects.get(
                          pk=a.pk).generation} for a in (web1, web2)])

    assert caught.value.code == "decommissioned"
    assert "web-2 is decommissioned" in caught.value.message


def test_decommissioning_a_canary_releases_its_pin_and_the_wave_goes_on(
        environment, second, fleet):
    web1, web2, web3 = fleet(3)
    rollout = start_rollout(environment, second, [web1, web2], waves=MANUAL_WAVES)
    ack(web1, second)

    _decommission(web2)

    assert pins([web2]) == {"web-2": (None, None)}
    assert RolloutTarget.objects.get(rollout=rollout, agent_id=web2.pk).state == "released"
    # web-2 neither blocks nor acknowledges: web-1's acknowledgement confirms the wave.
    confirmed = confirm(rollout)
    assert fresh(confirmed).current_wave == 1
    assert pins([web3]) == {"web-3": (2, rollout.pk)}


def test_a_wave_of_only_decommissioned_agents_passes(
        environment, second, fleet):
    web1, web2 = fleet(2)
    rollout = start_rollout(environment, second, [web1], waves=MANUAL_WAVES)
    ack(web1, second)

    _decommission(web2)
    confirm(rollout)

    assert pins([web2]) == {"web-2": (None, None)}
    evidence = selectors.wave_evidence(fresh(rollout))
    assert (evidence.decommissioned, evidence.waiting, evidence.complete) == (
        ["web-2"], [], True)
    # A wave left with only decommissioned agents passes: the rollout completes.
    done = confirm(rollout)
    assert fresh(done).state == "completed"
