"""The dashboard leaves decommissioned agents out of its counts and its agents panel."""

import pytest

from apps.dashboard import selectors
from apps.releases.services import agent_decommission
from tests.factories import enrolled_agents

pytestmark = pytest.mark.django_db


def test_overview_and_agents_panel_leave_decommissioned_agents_out(environment, first,
                                                                   superuser):
    web1, web2, web3 = enrolled_agents(environment, 3, actor=superuser)
    agent_decommission(agent=web2.agent, expected_generation=web2.agent.generation,
                       actor=superuser)

    overview = {row["environment"].pk: row for row in selectors.overview_for(superuser)}
    panel = selectors.agents_panel(environment)

    assert overview[environment.pk]["agents"] == 2
    assert [row["agent"].name for row in panel["rows"]] == ["web-1", "web-3"]
    assert panel["total"] == 2
    assert [a.name for a in selectors.canary_choices(environment)] == ["web-1", "web-3"]
