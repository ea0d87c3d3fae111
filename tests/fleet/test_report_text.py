"""Free text an agent reports — a report's `message`, its health probe's `output` —
is stored neutralised: control, bidirectional, zero-width and other invisible
characters become U+FFFD (LF and tab stay, CRLF becomes LF), so an ANSI escape, a
carriage return or U+202E cannot rewrite what the dashboard and the API show. The
report itself is kept (the output is the evidence), never a 500. Drift summaries,
short names of a change, are refused instead (tests/fleet/test_drift.py)."""

import pytest

from apps.core.text import neutralised
from apps.fleet.models import Agent, Deployment
from tests.fleet.support import REPORTS, agent_url
from tests.fleet.test_drift import DRIFT, EDITED
from tests.fleet.test_report_health import UNHEALTHY, body

pytestmark = pytest.mark.django_db

HOSTILE = [
    ("reversed \u202etxt.exe", "reversed \ufffdtxt.exe"),
    ("\x1b[2J\x1b[31mred\x1b[0m", "\ufffd[2J\ufffd[31mred\ufffd[0m"),
    ("ok\rFAILED", "ok\ufffdFAILED"),
    ("line one\r\nline two\n\tindented", "line one\nline two\n\tindented"),
    ("zero\u200bwidth\u2066isolate\u2069", "zero\ufffdwidth\ufffdisolate\ufffd"),
    ("bell\x07 del\x7f c1\x85 sep\u2028 bom\ufeff pua\ue000", "bell\ufffd del\ufffd "
     "c1\ufffd sep\ufffd bom\ufffd pua\ufffd"),
    ("plain text, émoji 🎉 and 中文", "plain text, émoji 🎉 and 中文"),
]


@pytest.mark.parametrize(("sent", "shown"), HOSTILE)
def test_the_rule(sent, shown):
    assert neutralised(sent) == shown


@pytest.mark.parametrize(("sent", "shown"), HOSTILE)
def test_a_reports_message_and_health_output_are_stored_neutralised(
        sent, shown, enroll, first, client_for):
    agent = enroll()
    health = {**UNHEALTHY, "output": sent}
    response = agent.client.post(REPORTS, body(first, "failed", sent, health), format="json")

    assert response.status_code == 201, response.content
    deployment = Deployment.objects.get(pk=response.json()["deployment_id"])
    assert (deployment.message, deployment.health["output"]) == (shown, shown)
    assert Agent.objects.get(pk=agent.agent.pk).last_message == shown
    status = client_for("viewer").get(agent_url(agent.agent.pk)).json()["status"]
    assert status["last_health"]["output"] == shown


def test_the_dashboard_shows_no_bidirectional_override(enroll, first, superuser, client):
    agent = enroll()
    agent.client.post(REPORTS, body(first, "failed", "evil \u202egnp.exe",
                                    {**UNHEALTHY, "output": "\x1b[31m\u202e"}), format="json")
    client.force_login(superuser)
    page = client.get("/e/shop/prod/").content.decode()
    assert "evil \ufffdgnp.exe" in page
    assert "\u202e" not in page and "\x1b" not in page


@pytest.mark.parametrize("summary", ["a\u202eb", "a\x1b[31m", "a\rb", "a\nb"])
def test_a_drift_summary_with_such_characters_is_refused_naming_it(summary, enroll, first):
    agent = enroll()
    agent.client.post(REPORTS, body(first), format="json")
    response = agent.client.post(DRIFT, {
        "snapshot": first.number, "checksum": first.checksum,
        "files": [{**EDITED[0], "summary": summary}]}, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["details"][0]["field"] == "files[0].summary"


def test_a_message_at_its_length_limit_stays_within_it(enroll, first):
    agent = enroll()
    response = agent.client.post(REPORTS, body(first, "failed", "\r\n" * 2000), format="json")
    assert response.status_code == 201
    assert Deployment.objects.get(pk=response.json()["deployment_id"]).message == "\n" * 2000
