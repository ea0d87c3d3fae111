"""Drift in the dashboard: the drift policy on the environment page (changed by
owners at the version shown), a drift mark on an agent's row, and the drifted count
on the agents panel and the overview."""

import re

import pytest

from apps.audit.models import AuditEvent
from tests.dashboard.test_views import HTMX, flash, text, url
from tests.factories import enrolled_agents, session_client
from tests.fleet.support import report

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_cache")]

DRIFT = "/api/v1/agent/drift"
EDITED = [{"path": "nginx/shop.conf", "change": "modified", "summary": "+3 -1 lines"}]


@pytest.fixture
def as_owner(member):
    return session_client(member("owner"))


@pytest.fixture
def as_deployer(member):
    return session_client(member("deployer"))


@pytest.fixture
def fleet(environment, first):
    """Three agents that applied #1: web-1 drifted, web-2 drifted and restored, web-3 clean."""
    agents = enrolled_agents(environment, 3)
    for index, agent in enumerate(agents):
        assert report(agent.client, first).status_code == 201
        if index < 2:
            body = {"snapshot": 1, "checksum": first.checksum, "files": EDITED,
                    "restored": index == 1}
            assert agent.client.post(DRIFT, body, format="json").status_code == 200
    return agents


def test_drifted_agents_are_marked_and_counted_on_the_agents_panel(fleet, as_deployer):
    panel = text(as_deployer.get(url("environment") + "?panel=agents", headers=HTMX))

    assert re.search(r'id="drifted-count"[^>]*>1 drifted<', panel)
    rows = dict(re.findall(r'<tr id="agent-\d+" data-agent="([^"]+)"(.*?)</tr>', panel, re.S))
    assert 'data-drift="drifted"' in rows["web-1"]
    assert "nginx/shop.conf: modified (+3 -1 lines)" in rows["web-1"]
    assert 'data-drift="restored"' in rows["web-2"]
    assert "data-drift" not in rows["web-3"]


def test_the_overview_counts_drifted_agents(fleet, as_deployer):
    page = text(as_deployer.get("/", headers=HTMX))

    assert re.search(r'class="badge drifted"[^>]*>1 drifted<', page)


def test_no_drifted_count_without_drift(environment, first, as_deployer):
    enrolled_agents(environment, 2)

    assert "drifted" not in text(as_deployer.get("/", headers=HTMX))
    assert "drifted-count" not in text(as_deployer.get(url("environment")))


def test_the_page_shows_the_drift_policy_and_only_owners_get_the_form(environment, first,
                                                                       as_deployer, as_owner):
    head = text(as_deployer.get(url("environment")))

    assert 'data-drift-policy="report"' in head
    assert "drift-policy-form" not in head
    assert "drift-policy-form" in text(as_owner.get(url("environment")))


def test_an_owner_switches_the_drift_policy_with_the_version_shown(environment, first,
                                                                    as_owner):
    page = text(as_owner.get(url("environment")))
    form = re.search(r'<form id="drift-policy-form".*?</form>', page, re.S).group(0)
    version = re.search(r'name="expected_version" value="(\d+)"', form).group(1)
    assert 'name="drift_policy" value="restore"' in form

    response = as_owner.post(url("drift-policy"), {"drift_policy": "restore",
                                                   "expected_version": version})

    assert (response.status_code, response["Location"]) == (302, url("environment"))
    page = text(as_owner.get(response["Location"]))
    assert 'data-drift-policy="restore"' in page
    assert "Drift policy: Restore" in flash(page)
    environment.refresh_from_db()
    assert environment.drift_policy == "restore"
    assert AuditEvent.objects.filter(action="environment.settings").latest("id").data == {
        "fields": ["drift_policy"]}


@pytest.mark.parametrize("data", [{"drift_policy": "ignore", "expected_version": "1"},
                                  {"drift_policy": "restore"},
                                  {"drift_policy": "restore", "expected_version": "x"}])
def test_a_bad_drift_policy_form_is_400(data, environment, first, as_owner):
    response = as_owner.post(url("drift-policy"), data, headers=HTMX)

    assert response.status_code == 400
    environment.refresh_from_db()
    assert environment.drift_policy == "report"


def test_a_deployer_may_not_switch_the_drift_policy(environment, first, as_deployer):
    response = as_deployer.post(url("drift-policy"), {"drift_policy": "restore",
                                                      "expected_version": "1"}, headers=HTMX)

    assert response.status_code == 403
    environment.refresh_from_db()
    assert environment.drift_policy == "report"
