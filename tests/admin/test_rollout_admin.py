"""Rollouts in the admin: scoped, read-only, roll back through the service."""

import pytest

from apps.fleet.models import Agent
from apps.releases.services import environment_update
from apps.rollouts.models import Rollout
from tests.admin.support import listed, messages_of
from tests.factories import enrolled_agents, publish, publish_variant, start_rollout

ROLLOUTS = "/admin/rollouts/rollout/"


@pytest.fixture
def rollout(environment, superuser):
    publish(environment, superuser)
    canary, _ = enrolled_agents(environment, 2, actor=superuser)
    environment_update(environment=environment, actor=superuser, release_policy="staged")
    second = publish_variant(environment, superuser, workers=8)
    return start_rollout(environment, second, [canary], actor=superuser)


def test_owners_see_their_rollouts_and_outsiders_none(login, tenant_owner, staff_outsider,
                                                      rollout):
    assert listed(login(tenant_owner).get(ROLLOUTS)) == [rollout]
    assert listed(login(staff_outsider).get(ROLLOUTS)) == []
    page = login(tenant_owner).get(f"{ROLLOUTS}{rollout.pk}/change/")
    assert page.status_code == 200
    assert "web-1" in page.content.decode()


def test_rolling_back_from_the_admin_uses_the_service(login, tenant_owner, rollout):
    response = login(tenant_owner).post(ROLLOUTS, {"action": "roll_back",
                                                   "_selected_action": [rollout.pk]},
                                        follow=True)

    rollout.refresh_from_db()
    assert rollout.state == "rolled_back"
    assert rollout.rollback_snapshot.number == 3
    assert any("rolled back" in m for m in messages_of(response))


def test_confirming_an_unacknowledged_wave_reports_why(login, tenant_owner, rollout):
    response = login(tenant_owner).post(ROLLOUTS, {"action": "confirm",
                                                   "_selected_action": [rollout.pk]},
                                        follow=True)

    assert Rollout.objects.get(pk=rollout.pk).current_wave == 0
    assert any("not yet acknowledged" in m for m in messages_of(response))


def test_releasing_a_rolled_back_rollouts_kept_pins_from_the_admin(login, tenant_owner,
                                                                   environment, superuser,
                                                                   rollout):
    environment_update(environment=environment, actor=superuser, keep_rollout_pins=True)
    client = login(tenant_owner)
    client.post(ROLLOUTS, {"action": "roll_back", "_selected_action": [rollout.pk]})
    assert Agent.objects.filter(pin_rollout=rollout).count() == 1  # the pending web-2

    response = client.post(ROLLOUTS, {"action": "release_pins",
                                      "_selected_action": [rollout.pk]}, follow=True)
    again = client.post(ROLLOUTS, {"action": "release_pins",
                                   "_selected_action": [rollout.pk]}, follow=True)

    assert not Agent.objects.filter(pin_rollout=rollout).exists()
    assert any("pins released" in m for m in messages_of(response))
    assert any("holds no pins" in m for m in messages_of(again))


def test_a_rollouts_waves_and_summary_are_shown_as_indented_json(login, tenant_owner, rollout):
    page = login(tenant_owner).get(f"/admin/rollouts/rollout/{rollout.pk}/change/")
    import json

    from django.utils.html import escape

    waves = json.dumps(rollout.waves, indent=2, sort_keys=True)
    assert "\n" in waves
    assert f'<pre class="bw-json">{escape(waves)}</pre>' in page.content.decode()
