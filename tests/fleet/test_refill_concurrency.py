"""The poll answers an activation writes to the cache, while others change the same
agents at the same moment, on PostgreSQL with real row locks: whatever order the
commits and their refills land in, every cached answer the poll debts trust is the
database's answer."""

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection, transaction

from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, polldebt, selectors, services
from apps.fleet.models import Agent
from tests.factories import enrolled_agents, poll, publish, publish_variant

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

TIMEOUT_S = 60


@pytest.fixture(autouse=True)
def _empty_cache(empty_cache):
    """Poll answers live in the cache: the test starts and ends with it empty."""


def _race(calls) -> list:
    barrier = threading.Barrier(len(calls))

    def run(call):
        try:
            barrier.wait(timeout=TIMEOUT_S)
            return call()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls, timeout=TIMEOUT_S))


def test_a_publish_racing_pins_and_a_revocation_leaves_no_trusted_stale_answer(
        environment, superuser, monkeypatch):
    first = publish(environment, superuser)
    nodes = enrolled_agents(environment, 6, actor=superuser)
    for node in nodes:
        assert poll(node.client).status_code == 200
    pinned, revoked = nodes[:2], nodes[2]

    def pin(node):
        with transaction.atomic():
            services.pins_set([node.agent.pk], snapshot=first, actor=superuser)

    outcomes = _race([
        lambda: publish_variant(environment, superuser, workers=8),
        *[(lambda n=n: pin(n)) for n in pinned],
        lambda: enrollment.agent_token_revoke(agent=revoked.agent, actor=superuser),
    ])
    assert not [o for o in outcomes if isinstance(o, Exception)], outcomes
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts())

    trusted = 0
    for node in nodes:
        agent = selectors.agents_with_desired(Agent.objects.filter(pk=node.agent.pk)).get()
        state = fleet_cache.poll_state(agent.token_key)
        owed = polldebt.owes(agent.token_key, state and state.get("generation"))
        if state is None or owed:
            continue
        trusted += 1
        assert agent.token_revoked_at is None, node.agent.name
        assert state["etag"] == selectors.desired_state_for(agent)[1], node.agent.name
    assert trusted >= 3  # the followers' refilled answers are trusted at once
    assert {selectors.desired_state_for(n.fresh())[0]["snapshot"]["number"]
            for n in pinned} == {1}
