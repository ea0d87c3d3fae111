"""The agent's hot paths read a snapshot's identity, never its content: the bundle,
files and sources can be hundreds of KiB, and a snapshot joined to agent rows
repeats on every row (the refill after a publish reads every agent of the
environment at once: 500 agents of a 94 KB bundle took 1.1 s, 70 ms without)."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from apps.fleet import selectors
from apps.releases import services as releases
from apps.snapshots.models import CONTENT_COLUMNS
from tests import factories
from tests.factories import poll
from tests.fleet.support import bundle_url, report

pytestmark = pytest.mark.django_db

# A content column selected from a snapshot (or a joined one, aliased T3, T4, ...).
COLUMNS = "|".join(CONTENT_COLUMNS)
CONTENT_READ = re.compile(rf'(?:"snapshots_snapshot"|\bT\d+)\."(?:{COLUMNS})"')
CONFIG_READ = re.compile(r'"environments_environment"\."config(?:_schema)?"')


def _content_reads(queries) -> list[str]:
    return [q["sql"] for q in queries
            if CONTENT_READ.search(q["sql"]) or CONFIG_READ.search(q["sql"])]


def _client(enrolled) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {enrolled.token}")
    return client


@pytest.fixture
def pushed(environment, first, superuser):
    """A manual agent with a pending push of #1 (its report names the deployment)."""
    enrolled = factories.enrolled_agent(environment, "web-9", mode="manual", actor=superuser)
    [deployment] = releases.snapshot_deploy(snapshot=first, agent_ids=[enrolled.agent.pk],
                                            actor=superuser)
    return enrolled, deployment


def test_polls_and_reports_never_read_snapshot_content(environment, first, superuser,
                                                       pushed, empty_cache):
    enrolled = factories.enrolled_agent(environment, "web-1", actor=superuser)
    client = _client(enrolled)
    with CaptureQueriesContext(connection) as queries:
        assert poll(client).status_code == 200  # from the database: an empty cache
        assert report(client, first).status_code == 201
        push_client, deployment = _client(pushed[0]), pushed[1]
        assert report(push_client, first, deployment_id=deployment.pk).status_code == 201
    assert len(queries) > 5 and _content_reads(queries) == []


def test_the_refill_of_many_agents_reads_no_snapshot_content(environment, first, superuser):
    keys = [a.agent.token_key for a in factories.enrolled_agents(environment, 3,
                                                                  actor=superuser)]
    with CaptureQueriesContext(connection) as queries:
        states = selectors.poll_states_of(keys)
    assert sorted(states) == sorted(keys)
    assert _content_reads(queries) == []


def test_the_bundle_reads_only_the_form_it_sends(environment, first, superuser):
    client = _client(factories.enrolled_agent(environment, "web-1", actor=superuser))
    with CaptureQueriesContext(connection) as queries:
        answer = client.get(bundle_url(first.number), HTTP_ACCEPT_ENCODING="gzip")
    assert answer.status_code == 200
    reads = _content_reads(queries)
    assert len(reads) == 1 and '"bundle_gzip"' in reads[0]
    assert not re.search(r'"(?:files|source|bundle)"', reads[0])


def test_a_desired_answer_still_names_the_snapshot(environment, first, superuser):
    """Deferring the content changes nothing an agent is told."""
    client = _client(factories.enrolled_agent(environment, "web-1", actor=superuser))
    body = poll(client).json()
    assert body["snapshot"] == {"number": first.number, "label": first.label,
                                "checksum": first.checksum,
                                "bundle_url": bundle_url(first.number)}
