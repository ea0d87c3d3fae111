"""The refill off the committing request: where tasks are not inline (production),
a change's poll answers are refilled on the process's refill thread after it
commits — the change answers first, the answers follow, prompts that arrive while
it works are merged into one run, and a run that fails stops nothing."""

import threading

import pytest

from apps.fleet import cache as fleet_cache
from apps.fleet import refill
from apps.fleet.models import Agent
from tests.factories import enrolled_agents, poll, publish, publish_variant

pytestmark = pytest.mark.django_db(transaction=True)

TIMEOUT_S = 30


@pytest.fixture(autouse=True)
def _threaded(empty_cache, monkeypatch):
    """Tasks not inline, as in production; the thread is idle before and after."""
    monkeypatch.setattr(refill, "tasks_inline", lambda: False)
    yield
    assert refill.wait_until_refilled(TIMEOUT_S)


@pytest.fixture
def runs(monkeypatch):
    """The key lists each refill run was given, with a gate a test may close to
    hold the thread inside a run."""
    real, seen, gate = refill.selectors.poll_states_of, [], threading.Event()
    gate.set()

    def watched(keys):
        seen.append(list(keys))
        assert gate.wait(TIMEOUT_S)
        return real(keys)

    monkeypatch.setattr(refill.selectors, "poll_states_of", watched)
    return seen, gate


def _states(agents) -> dict:
    return {a.agent.token_key: fleet_cache.poll_state(a.agent.token_key) for a in agents}


def test_a_publish_answers_before_its_refill_and_the_answers_follow(environment, superuser,
                                                                   runs):
    seen, gate = runs
    publish(environment, superuser)
    nodes = enrolled_agents(environment, 3, actor=superuser)
    for node in nodes:
        assert poll(node.client).status_code == 200
    assert refill.wait_until_refilled(TIMEOUT_S)
    gate.clear()

    publish_variant(environment, superuser, workers=8)  # returns while the refill waits

    assert not refill.wait_until_refilled(0.2)
    gate.set()
    assert refill.wait_until_refilled(TIMEOUT_S)
    generations = dict(Agent.objects.values_list("token_key", "generation"))
    for key, state in _states(nodes).items():
        assert state is not None and state["generation"] == generations[key]
        assert state["body"] and b'"number":2' in state["body"]
    assert sorted(a.agent.token_key for a in nodes) in seen


def test_prompts_arriving_during_a_run_are_merged_into_one(environment, superuser, runs):
    seen, gate = runs
    publish(environment, superuser)
    nodes = enrolled_agents(environment, 3, actor=superuser)
    keys = sorted(n.agent.token_key for n in nodes)
    gate.clear()
    refill.refill_after_commit(keys[:1])
    while not seen:  # the thread is inside the first run
        threading.Event().wait(0.01)

    refill.refill_after_commit(keys[1:2])
    refill.refill_after_commit(keys[1:])
    gate.set()

    assert refill.wait_until_refilled(TIMEOUT_S)
    assert seen == [keys[:1], keys[1:]]
    assert all(state is not None for state in _states(nodes).values())


def test_a_run_that_fails_stops_nothing(environment, superuser, monkeypatch):
    publish(environment, superuser)
    node = enrolled_agents(environment, 1, actor=superuser)[0]
    real, calls = refill.selectors.poll_states_of, []

    def fails_once(keys):
        calls.append(keys)
        if len(calls) == 1:
            raise RuntimeError("a bug")
        return real(keys)

    monkeypatch.setattr(refill.selectors, "poll_states_of", fails_once)
    refill.refill_after_commit([node.agent.token_key])
    assert refill.wait_until_refilled(TIMEOUT_S)
    assert fleet_cache.poll_state(node.agent.token_key) is None

    refill.refill_after_commit([node.agent.token_key])

    assert refill.wait_until_refilled(TIMEOUT_S)
    assert fleet_cache.poll_state(node.agent.token_key)["agent_id"] == node.agent.pk
