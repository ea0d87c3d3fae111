"""An agent's generation (its CAS counter) moves with its desired state, and only then."""

import pytest

from apps.core.errors import Conflict
from apps.fleet import heartbeats
from apps.releases import services as releases
from apps.releases.services import environment_update
from tests.factories import poll, publish, publish_variant
from tests.fleet.support import agent_url, report


def test_push_bumps_the_generation(enroll, first, superuser):
    agent = enroll(mode="manual")
    before = agent.fresh().generation

    releases.snapshot_deploy(snapshot=first, agent_ids=[agent.agent.pk], actor=superuser)

    assert agent.fresh().generation == before + 1


@pytest.mark.parametrize("start,switch", [("auto_pull", "manual"), ("manual", "auto_pull")])
def test_mode_switch_bumps_the_generation(start, switch, enroll, first, client_for):
    agent = enroll(mode=start)
    before = agent.fresh().generation

    response = client_for("deployer").patch(agent_url(agent.agent.pk), {"mode": switch},
                                            format="json")

    assert response.json()["generation"] == before + 1
    assert agent.fresh().generation == before + 1


def test_setting_the_same_mode_keeps_the_generation(enroll, first, client_for):
    agent = enroll()
    before = agent.fresh().generation

    client_for("deployer").patch(agent_url(agent.agent.pk), {"mode": "auto_pull"},
                                 format="json")

    assert agent.fresh().generation == before


def test_activation_bumps_auto_pull_agents_only(enroll, first, environment, superuser):
    follower, manual = enroll("web-1"), enroll("web-2", mode="manual")
    before = (follower.fresh().generation, manual.fresh().generation)

    publish_variant(environment, superuser, workers=8)

    assert (follower.fresh().generation, manual.fresh().generation) == (
        before[0] + 1, before[1])


def test_explicit_activation_bumps_auto_pull_agents(enroll, environment, superuser):
    gated = environment_update(environment=environment, release_policy="staged",
                               actor=superuser)
    agent = enroll()
    snapshot = publish(gated, superuser)
    before = agent.fresh().generation

    releases.snapshot_activate(snapshot=snapshot, actor=superuser)

    assert agent.fresh().generation == before + 1


def test_polls_and_reports_leave_the_generation(enroll, first):
    agent = enroll()
    before = agent.fresh().generation

    etag = poll(agent.client)["ETag"]
    poll(agent.client, etag)
    report(agent.client, first)
    heartbeats.heartbeats_flush()

    assert agent.fresh().generation == before


def test_refused_push_leaves_the_generation(enroll, first, environment, superuser):
    agent = enroll()
    publish_variant(environment, superuser, workers=8)
    before = agent.fresh().generation

    with pytest.raises(Conflict):
        releases.snapshot_deploy(snapshot=first, agent_ids=[agent.agent.pk], actor=superuser)

    assert agent.fresh().generation == before
