"""No stampede after a publish: a change that bumps agents' generations (activation,
pushes, pins) writes their new poll answers to the cache on commit, computed for
all of them at once, and its poll debt trusts answers of the generation it reached;
the poll's route sends such an answer from the cache. No agent gets a
stale or wrong answer meanwhile: the cache's answer is always the database's."""

import threading
import time
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

from agentapi import cached, longpoll
from agentapi.cached import DESIRED_PATH
from apps.fleet import announcements, enrollment, polldebt, refill, rules, selectors, services
from apps.fleet import cache as fleet_cache
from apps.fleet.models import Agent, PollInvalidation
from apps.releases.services import environment_update
from apps.snapshots.models import Snapshot
from tests.agentroutes import stack_answer
from tests.factories import poll, publish_variant, start_rollout
from tests.fleet.support import agent_url, deploy_url

DATABASE = "database"  # answered from the database (agentapi.desired)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The process's poll debts on a clock the test moves; heartbeats not due."""
    tick = Clock()
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=tick))
    fleet_cache._heartbeats._flushed_at = time.time() + 3600
    return tick


def _debts_read(clock) -> None:
    """The process re-reads its poll debts (as it does every second)."""
    clock.now += rules.POLL_DEBT_REFRESH_S
    polldebt.owes("")


def _poll_answer(agent, etag: str | None, *, method="GET", query=b""):
    """(status, headers, body) of the poll's route, the status DATABASE when the poll
    was answered from the database."""
    headers = [(b"host", b"testserver"), (b"authorization", f"Bearer {agent.token}".encode())]
    if etag is not None:
        headers.append((b"if-none-match", etag.encode()))
    scope = {"type": "http", "method": method, "path": DESIRED_PATH, "query_string": query,
             "scheme": "http", "client": ("10.0.0.7", 5000), "headers": headers}
    status, answered, body = stack_answer(scope)
    return DATABASE if "x-request-id" in answered else status, answered, body


def _pin(client, agent, number: int = 1):
    return client.post(agent_url(agent.agent.pk, "/pin"), {
        "snapshot": number, "expected_generation": agent.fresh().generation}, format="json")


def _database_answer(agent) -> tuple[dict, str]:
    fresh = selectors.agents_with_desired(Agent.objects.filter(pk=agent.agent.pk)).get()
    return selectors.desired_state_for(fresh)


def _assert_cache_answers_as_the_database(agents, etags) -> None:
    """Each agent's poll with its old ETag, from the cache: 304 only if its answer did
    not change, 200 only with the database's body, else Django's to answer."""
    for agent in agents:
        body, etag = _database_answer(agent)
        status, headers, sent = _poll_answer(agent, etags[agent.agent.name])
        if status == 304:
            assert headers["etag"] == etags[agent.agent.name] == etag, agent.agent.name
        elif status == 200:
            assert (headers["etag"], sent) == (etag, selectors.desired_body_bytes(body))
        else:
            assert status == DATABASE


def _warm(agents) -> dict[str, str]:
    etags = {}
    for agent in agents:
        response = poll(agent.client)
        assert response.status_code == 200
        etags[agent.agent.name] = response["ETag"]
    return etags


# -- the rules -----------------------------------------------------------------------------


def test_a_debt_trusts_answers_of_the_generation_its_changes_reached():
    required = rules.debt_generations([(["a", "b"], {"a": 3, "b": 5}), (["a"], {"a": 4}),
                                       (["b", "c"], None)])
    assert required == {"a": 4, "b": None, "c": None}
    keys = rules.IndebtedKeys(required)
    assert keys == frozenset({"a", "b", "c"}) and keys.generations == {"a": 4}
    assert rules.cached_answer_reflects(4, 4) and rules.cached_answer_reflects(4, 5)
    assert not rules.cached_answer_reflects(4, 3)
    assert not rules.cached_answer_reflects(4, None)
    assert not rules.cached_answer_reflects(None, 99)


# -- the publish ------------------------------------------------------------------------------


def test_after_a_publish_the_old_etag_is_answered_200_from_the_cache_with_no_sql(
        enroll, first, environment, superuser, clock, django_capture_on_commit_callbacks,
        django_assert_num_queries):
    agent = enroll()
    old = _warm([agent])["web-1"]
    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)
    _debts_read(clock)

    with django_assert_num_queries(0):
        status, headers, body = _poll_answer(agent, old)
    # Once per answer and process: a repeat is the database's (and the agent's rate's).
    again, from_database, database_body = stack_answer_of(agent, old)

    assert (status, again) == (200, 200)
    assert body == database_body and b'"number":2' in body
    # The same headers but the database's request id (nothing is logged from the cache).
    own = {"x-request-id", "content-length"}
    assert {n: v for n, v in headers.items() if n not in own} == {
        n: v for n, v in from_database.items() if n not in own}
    assert _poll_answer(agent, headers["etag"])[0] == 304
    assert _poll_answer(agent, old, method="HEAD")[0] == DATABASE  # the cache's 200s are GETs'


def stack_answer_of(agent, etag):
    return stack_answer({"type": "http", "method": "GET", "path": DESIRED_PATH,
                         "query_string": b"", "scheme": "http", "client": ("10.0.0.7", 5000),
                         "headers": [(b"host", b"testserver"), (b"if-none-match", etag.encode()),
                                     (b"authorization", f"Bearer {agent.token}".encode())]})


def test_a_publish_refills_its_followers_with_two_queries_however_many(
        enroll, first, environment, superuser, django_assert_num_queries):
    few = [enroll(f"web-{i}") for i in range(2)]
    many = [enroll(f"db-{i}") for i in range(12)]

    for group in (few, few + many):
        keys = [a.agent.token_key for a in group]
        with django_assert_num_queries(2):
            refill.refill_and_announce(keys)
        states = {k: fleet_cache.poll_state(k) for k in keys}
        assert all(s is not None and s["generation"] and s["body"] for s in states.values())


def test_a_refill_is_written_and_announced_a_chunk_at_a_time(
        enroll, first, monkeypatch, django_assert_num_queries):
    """The first agents hear of a change while the answers of the last are computed."""
    agents = [enroll(f"web-{i}") for i in range(12)]
    keys = sorted(a.agent.token_key for a in agents)
    monkeypatch.setattr(refill, "REFILL_CHUNK", 5)
    announced = []
    monkeypatch.setattr(refill.announcements, "announce",
                        lambda chunk: announced.append((list(chunk), all(
                            fleet_cache.poll_state(k) is not None for k in chunk))))

    with django_assert_num_queries(6):
        refill.refill_and_announce(keys)

    assert announced == [(keys[:5], True), (keys[5:10], True), (keys[10:], True)]


def _published_refill_pending(agent, environment, superuser, clock, monkeypatch,
                              capture) -> list[str]:
    """Publish with the refill of poll answers held back (what a web node sees between
    a change's commit and its refill): the keys it will refill."""
    pending = []
    monkeypatch.setattr(refill, "refill_after_commit", pending.extend)
    with capture(execute=True):
        publish_variant(environment, superuser, workers=8)
    _debts_read(clock)  # the debt is known; the cache still holds the old answer
    assert pending == [agent.agent.token_key]
    return pending


def test_a_held_poll_meeting_a_refill_under_way_waits_for_it_not_the_database(
        enroll, first, environment, superuser, clock, monkeypatch,
        django_capture_on_commit_callbacks, django_assert_num_queries):
    """After a publish, the long-polls that arrive before their agent's answer is
    refilled (a wait renewed meanwhile) wait for the refill's announcement and take
    its answer from the cache, instead of each going to the database."""
    agent = enroll()
    old = _warm([agent])["web-1"]
    keys = _published_refill_pending(agent, environment, superuser, clock, monkeypatch,
                                     django_capture_on_commit_callbacks)
    refilled = selectors.poll_states_of(keys)  # what the refill thread will write

    def refill_done():
        time.sleep(0.3)
        held_by = time.monotonic() + 5  # once the poll waits (a loaded machine is slow)
        while keys[0] not in longpoll._waiters._by_key and time.monotonic() < held_by:
            time.sleep(0.01)
        fleet_cache.store_poll_states(refilled)
        announcements.announce(keys)

    with django_assert_num_queries(0):
        status, headers, body, took = _held_during(agent, old, refill_done)

    assert (status, took < 5) == (200, True)
    database_body, etag = _database_answer(agent)
    assert (headers["etag"], body) == (etag, selectors.desired_body_bytes(database_body))


def _held_during(agent, old: str, refill) -> tuple[int, dict, bytes, float]:
    """The answer to the agent's held poll (If-None-Match: `old`, wait=20)
    while `refill` runs on a thread, and the seconds it took."""
    refilling = threading.Thread(target=refill)
    started = time.monotonic()
    refilling.start()
    try:
        status, headers, body = _poll_answer(agent, old, query=b"wait=20")
    finally:
        refilling.join()
    return status, headers, body, time.monotonic() - started


@pytest.mark.slow
def test_a_held_poll_whose_refill_does_not_come_goes_to_the_database(
        enroll, first, environment, superuser, clock, monkeypatch,
        django_capture_on_commit_callbacks, to_django):
    """A refill lost (its process died) or slow: after REFILL_WAIT_S the database
    answers; the stale cached answer is never sent."""
    agent = enroll()
    old = _warm([agent])["web-1"]
    _published_refill_pending(agent, environment, superuser, clock, monkeypatch,
                              django_capture_on_commit_callbacks)
    monkeypatch.setattr(cached, "REFILL_WAIT_S", 0.5)
    to_django()  # the set-up's polls

    started = time.monotonic()
    assert _poll_answer(agent, old, query=b"wait=20")[0] == DATABASE
    assert 0.4 < time.monotonic() - started < 10  # not the 20 s asked for
    assert to_django() == {"refilling": 1}
    # The database's answer is the cache's now: the refill lost costs one query.
    assert _poll_answer(agent, old)[0] == 200
    assert to_django() == {}


@pytest.mark.slow
def test_a_held_poll_waits_for_a_slow_refill_while_the_refill_is_heard_from(
        enroll, first, environment, superuser, clock, monkeypatch,
        django_capture_on_commit_callbacks, django_assert_num_queries):
    """A refill slower than REFILL_WAIT_S (a loaded machine) that keeps announcing
    the chunks of other agents is under way: the poll waits for its own answer
    rather than join the database with the rest of the storm."""
    agent = enroll()
    old = _warm([agent])["web-1"]
    keys = _published_refill_pending(agent, environment, superuser, clock, monkeypatch,
                                     django_capture_on_commit_callbacks)
    refilled = selectors.poll_states_of(keys)
    monkeypatch.setattr(cached, "REFILL_WAIT_S", 0.5)

    def slow_refill():
        for chunk in range(8):  # 1.6 s of other agents' chunks, one every 0.2 s
            time.sleep(0.2)
            announcements.announce([f"other{chunk:08d}"])
        fleet_cache.store_poll_states(refilled)
        announcements.announce(keys)

    with django_assert_num_queries(0):
        status, headers, body, took = _held_during(agent, old, slow_refill)

    assert status == 200 and took > 1.5
    database_body, etag = _database_answer(agent)
    assert (headers["etag"], body) == (etag, selectors.desired_body_bytes(database_body))


def test_after_a_publish_polls_are_304_from_the_cache_not_the_database(
        enroll, first, environment, superuser, clock, django_capture_on_commit_callbacks,
        django_assert_num_queries):
    """Through Django too: the refilled answer is trusted at once, so the agent that
    took the new answer is 304 with no query, in the debt's grace period."""
    agent = enroll()
    _warm([agent])
    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)
    _debts_read(clock)
    assert PollInvalidation.objects.exists()
    new = fleet_cache.poll_state(agent.agent.token_key)["etag"]

    with django_assert_num_queries(0):
        assert poll(agent.client, new).status_code == 304


def test_a_pinned_agent_keeps_its_answer_through_a_publish(
        enroll, first, environment, superuser, clock, client_for,
        django_capture_on_commit_callbacks):
    pinned, follower = enroll("web-1"), enroll("web-2")
    with django_capture_on_commit_callbacks(execute=True):
        assert _pin(client_for("deployer"), pinned).status_code < 300
    etags = _warm([pinned, follower])
    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)
    _debts_read(clock)

    assert _poll_answer(pinned, etags["web-1"])[0] == 304
    status, _, body = _poll_answer(follower, etags["web-2"])
    assert status == 200 and b'"number":2' in body
    _assert_cache_answers_as_the_database([pinned, follower], etags)


def test_wave_agents_get_their_waves_answer_and_the_others_theirs(
        enroll, first, environment, superuser, clock, django_capture_on_commit_callbacks):
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    agents = [enroll(f"web-{i}") for i in range(1, 5)]
    with django_capture_on_commit_callbacks(execute=True):
        second = publish_variant(environment, superuser, workers=8)
    etags = _warm(agents)

    with django_capture_on_commit_callbacks(execute=True):
        start_rollout(environment, second, [agents[0].agent], actor=superuser,
                      waves=[{"count": 1}, {"percent": 100}])
    _debts_read(clock)

    # The canary is held on #2, the others on #1 (frozen by the rollout).
    assert _database_answer(agents[0])[0]["snapshot"]["number"] == 2
    assert {_database_answer(a)[0]["snapshot"]["number"] for a in agents[1:]} == {1}
    status, _, body = _poll_answer(agents[0], etags["web-1"])
    assert status == 200 and b'"number":2' in body
    _assert_cache_answers_as_the_database(agents, etags)


def test_a_token_revoked_right_after_a_publish_is_never_answered_from_the_cache(
        enroll, first, environment, superuser, clock, django_capture_on_commit_callbacks):
    agent = enroll()
    old = _warm([agent])["web-1"]
    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)
        keys = [agent.agent.token_key]
    new = fleet_cache.poll_state(agent.agent.token_key)["etag"]
    with django_capture_on_commit_callbacks(execute=False):  # the cache drop failed
        enrollment.agent_token_revoke(agent=agent.fresh(), actor=superuser)
    _debts_read(clock)

    assert _poll_answer(agent, old)[0] == DATABASE
    assert _poll_answer(agent, new)[0] == DATABASE
    assert poll(agent.client, new).status_code == 401
    # A refill that ran after the revocation committed writes nothing for the token.
    refill.refill_and_announce(keys)
    assert fleet_cache.poll_state(agent.agent.token_key) is None


def test_a_stale_write_back_after_the_refill_is_not_trusted_and_the_sweep_drops_it(
        enroll, first, environment, superuser, clock, django_capture_on_commit_callbacks):
    """A poll that read the database before the publish committed stores its old
    answer after the refill: untrusted (older than the debt's generation) until the
    sweep, which drops it and keeps the refilled answers of the other agents."""
    racer, other = enroll("web-1"), enroll("web-2")
    etags = _warm([racer, other])
    before = fleet_cache.poll_state(racer.agent.token_key)
    with django_capture_on_commit_callbacks(execute=True):
        publish_variant(environment, superuser, workers=8)
    refilled = fleet_cache.poll_state(other.agent.token_key)
    fleet_cache.store_poll_states({racer.agent.token_key: before})  # stale
    _debts_read(clock)

    assert fleet_cache.poll_state(racer.agent.token_key) == before
    assert _poll_answer(racer, etags["web-1"])[0] == DATABASE  # which stores its answer
    assert fleet_cache.poll_state(racer.agent.token_key)["etag"] == _database_answer(racer)[1]
    PollInvalidation.objects.update(
        seen_at=timezone.now() - timedelta(seconds=rules.POLL_DEBT_GRACE_S + 1))
    fleet_cache.store_poll_states({racer.agent.token_key: before})  # stale again
    assert services.poll_invalidations_sweep() == 1
    assert fleet_cache.poll_state(racer.agent.token_key) is None
    assert fleet_cache.poll_state(other.agent.token_key) == refilled
    _debts_read(clock)
    assert _poll_answer(other, refilled["etag"])[0] == 304


def test_a_refill_the_database_fails_drops_the_answers(
        enroll, first, environment, superuser, monkeypatch):
    agent = enroll()
    _warm([agent])

    def fails(keys):
        raise OperationalError("down")

    monkeypatch.setattr(selectors, "desired_states_of", fails)
    refill.refill_and_announce([agent.agent.token_key])
    assert fleet_cache.poll_state(agent.agent.token_key) is None


def test_the_refill_answers_as_each_agent_desires(enroll, first, environment, superuser,
                                                  client_for):
    """Manual, pinned, pushed and auto_pull agents: the refill writes, for each, the
    answer the view computes from the database."""
    auto, manual, pushed = enroll("web-1"), enroll("web-2", mode="manual"), enroll("web-3")
    publish_variant(environment, superuser, workers=8)
    deployer = client_for("deployer")
    assert _pin(deployer, manual).status_code < 300
    assert deployer.post(deploy_url(2), {"agents": [pushed.agent.pk]},
                         format="json").status_code < 300
    agents = [auto, manual, pushed]
    refill.refill_and_announce([a.agent.token_key for a in agents])

    for agent in agents:
        body, etag = _database_answer(agent)
        state = fleet_cache.poll_state(agent.agent.token_key)
        assert (state["etag"], state["body"]) == (etag, selectors.desired_body_bytes(body))
        assert state["generation"] == agent.fresh().generation
    assert Snapshot.objects.count() == 2
