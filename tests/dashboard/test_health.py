"""The agents panel shows what the last report's health probe found."""

import re

import pytest
from django.urls import reverse

from apps.fleet.models import Agent
from apps.releases import services as releases
from tests.factories import enrolled_agents, publish_variant, session_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_cache")]

HTMX = {"HX-Request": "true"}
UNHEALTHY = {"ok": False, "attempts": 3, "probe": "command",
             "output": "exited 1: upstream <shop> 502 Bad Gateway"}


def agent_row(html: str, agent: Agent) -> str:
    found = re.search(rf'<tr id="agent-{agent.pk}".*?</tr>', html, re.S)
    assert found, f"no row for {agent.name}"
    return found.group(0)


def report(agent, snapshot, status, health):
    releases.report_intake(agent=agent.agent, deployment_id=None, number=snapshot.number,
                           checksum=snapshot.checksum, status=status,
                           message=f"#{snapshot.number} {status}", health=health)


def test_agent_rows_show_a_failed_health_probe_and_a_healthy_one(first, environment, superuser,
                                                                  member):
    unhealthy, healthy, unprobed = enrolled_agents(environment, 3)
    report(healthy, first, "succeeded", {"ok": True, "attempts": 1, "probe": "url",
                                         "output": "HTTP 200: ok"})
    report(unhealthy, first, "succeeded", None)
    report(unprobed, first, "succeeded", None)
    second = publish_variant(environment, superuser, workers=8)
    report(unhealthy, second, "warning", UNHEALTHY)
    viewer = session_client(member("viewer"))

    html = viewer.get(reverse("dashboard:environment", args=["shop", "prod"])
                      + "?panel=agents", headers=HTMX).content.decode()

    failed = agent_row(html, unhealthy.agent)
    assert 'data-health="failed"' in failed
    assert ("health: failed after 3 attempts (command) — exited 1: upstream &lt;shop&gt; 502 "
            "Bad Gateway") in failed  # escaped, like any agent-sent text
    assert 'data-health="ok"' in agent_row(html, healthy.agent)
    assert "health: healthy after 1 attempt (url)" in agent_row(html, healthy.agent)
    assert "health:" not in agent_row(html, unprobed.agent)
