"""Poll debts: a change records, in its transaction, the agents whose cached poll
answers it makes stale (PollInvalidation); polls of those agents are answered from
the database until a sweep settles the debt. The on-commit cache drop is only a
shortcut: these tests mostly leave it out (as when the cache failed, or the
process died, at commit) and show the change still reaches the agent."""

from datetime import timedelta

import pytest
from django.db import DatabaseError
from django.test.utils import override_settings
from django.utils import timezone

from apps.fleet import cache as fleet_cache
from apps.fleet import enrollment, polldebt, rules, selectors, services
from apps.fleet.models import PollInvalidation
from tests.api_helpers import assert_error
from tests.factories import poll, publish_variant

CACHE_DOWN = {"default": {
    "BACKEND": "django.core.cache.backends.redis.RedisCache",
    "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens here: every cache call fails
}}


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now

    def advance(self, seconds: float = rules.POLL_DEBT_REFRESH_S):
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    """The process's poll debts on a clock the test moves."""
    tick = Clock()
    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts(clock=tick))
    return tick


def _warm(client) -> str:
    response = poll(client)
    assert response.status_code == 200
    return response["ETag"]


def _settle_all():
    """Past every grace period: what a sweep does then."""
    PollInvalidation.objects.update(
        seen_at=timezone.now() - timedelta(seconds=rules.POLL_DEBT_GRACE_S + 1))
    return services.poll_invalidations_sweep()


# -- the rules ----------------------------------------------------------------------------


def test_an_invalidation_is_sweepable_only_once_seen_and_past_its_grace():
    now = timezone.now()
    grace = timedelta(seconds=rules.POLL_DEBT_GRACE_S)

    assert not rules.poll_debt_sweepable(None, now)
    assert not rules.poll_debt_sweepable(now - grace + timedelta(milliseconds=1), now)
    assert rules.poll_debt_sweepable(now - grace, now)
    assert rules.poll_debts_need_sweep([None], now)  # to stamp it seen
    assert rules.poll_debts_need_sweep([now, now - grace], now)
    assert not rules.poll_debts_need_sweep([now], now)
    assert not rules.poll_debts_need_sweep([], now)


# -- the debt is written with the change ----------------------------------------------------


def test_an_activation_records_its_followers_keys_in_its_transaction(enroll, first, environment,
                                                                    superuser):
    agents = [enroll("web-1"), enroll("web-2"), enroll("web-3", mode="manual")]
    PollInvalidation.objects.all().delete()

    publish_variant(environment, superuser, workers=8)  # on-commit callbacks never run

    [row] = PollInvalidation.objects.all()
    assert row.token_keys == sorted(a.agent.token_key for a in agents[:2])
    assert row.seen_at is None


@pytest.mark.parametrize("change", ["disable", "mode", "revoke", "rotate", "pin", "unpin"])
def test_every_change_of_one_agent_records_its_key(change, enroll, first, superuser):
    agent = enroll().agent
    key = agent.token_key
    if change == "unpin":
        agent = services.agent_pin_hold(agent=agent, snapshot=first, actor=superuser)
    PollInvalidation.objects.all().delete()

    if change == "disable":
        services.agent_update(agent=agent, actor=superuser, enabled=False)
    elif change == "mode":
        services.agent_update(agent=agent, actor=superuser, mode="manual")
    elif change == "revoke":
        enrollment.agent_token_revoke(agent=agent, actor=superuser)
    elif change == "rotate":
        enrollment.agent_token_rotate(agent=agent, actor=superuser)
    elif change == "pin":
        services.agent_pin_hold(agent=agent, snapshot=first, actor=superuser)
    else:
        agent.refresh_from_db()
        services.agent_pin_release(agent=agent, expected_generation=agent.generation,
                                   actor=superuser)

    assert key in selectors.poll_debts()[0]


# -- polls of indebted agents are answered from the database --------------------------------


def test_an_activation_whose_cache_drop_never_ran_reaches_the_agent(
        enroll, first, environment, superuser, clock):
    agent = enroll()
    etag = _warm(agent.client)
    services.poll_invalidations_sweep()
    _settle_all()
    clock.advance()
    assert poll(agent.client, etag).status_code == 304  # from the cache

    second = publish_variant(environment, superuser, workers=8)  # drop never runs
    assert fleet_cache.poll_state(agent.agent.token_key)["etag"] == etag  # still stale
    clock.advance()
    answer = poll(agent.client, etag)

    assert answer.status_code == 200
    assert answer.json()["snapshot"]["number"] == second.number


def test_a_new_process_knows_the_debts_of_the_one_that_committed(
        enroll, first, environment, superuser, monkeypatch):
    agent = enroll()
    etag = _warm(agent.client)
    second = publish_variant(environment, superuser, workers=8)

    monkeypatch.setattr(polldebt, "_debts", polldebt._Debts())  # memory lost
    answer = poll(agent.client, etag)

    assert (answer.status_code, answer.json()["snapshot"]["number"]) == (200, second.number)


def test_a_racing_poll_writing_the_old_state_back_is_not_served(
        enroll, first, environment, superuser, clock):
    agent = enroll()
    etag = _warm(agent.client)
    _settle_all()
    key = agent.agent.token_key
    second = publish_variant(environment, superuser, workers=8)
    fleet_cache.forget_poll_states([key])  # the on-commit drop
    # A poll that read the database before the commit stores its answer after it.
    fleet_cache.store_poll_state(token_key=key, token_hash=agent.agent.token_hash,
                                 agent_id=agent.agent.pk,
                                 environment_id=agent.agent.environment_id, etag=etag)
    clock.advance()

    assert poll(agent.client, etag).status_code == 200
    assert services.poll_invalidations_sweep() == 0  # stamped seen: grace starts
    fleet_cache.store_poll_state(token_key=key, token_hash=agent.agent.token_hash,  # late
                                 agent_id=agent.agent.pk,  # write-back
                                 environment_id=agent.agent.environment_id, etag=etag)
    assert _settle_all() == 1
    clock.advance()

    assert fleet_cache.poll_state(key) is None
    fresh = poll(agent.client)
    assert fresh.json()["snapshot"]["number"] == second.number
    assert poll(agent.client, fresh["ETag"]).status_code == 304


def test_a_revoked_token_is_refused_though_its_cache_entry_survived(
        enroll, first, superuser, clock):
    agent = enroll()
    etag = _warm(agent.client)

    enrollment.agent_token_revoke(agent=agent.agent, actor=superuser)  # drop never runs
    clock.advance()

    assert fleet_cache.poll_state(agent.agent.token_key) is not None
    assert_error(poll(agent.client, etag), 401, "authentication_failed")


# -- what the 304 path costs ---------------------------------------------------------------


def test_a_cache_hit_runs_no_sql_and_one_query_per_refresh_interval(
        enroll, first, clock, django_assert_num_queries):
    agent = enroll()
    etag = _warm(agent.client)
    _settle_all()
    clock.advance()
    poll(agent.client, etag)

    with django_assert_num_queries(0):
        for _ in range(5):
            assert poll(agent.client, etag).status_code == 304
    clock.advance()
    with django_assert_num_queries(1):  # the debts, read once for the process
        for _ in range(5):
            assert poll(agent.client, etag).status_code == 304


def test_the_last_debts_are_kept_while_the_database_fails(
        enroll, first, environment, superuser, clock, monkeypatch, django_assert_num_queries):
    agent, other = enroll("web-1"), enroll("web-2")
    etag, other_etag = _warm(agent.client), _warm(other.client)
    _settle_all()
    services.agent_update(agent=agent.agent, actor=superuser, mode="manual")
    clock.advance()
    assert poll(other.client, other_etag).status_code == 304  # reads the debt: web-1's key

    def down():
        raise DatabaseError("the database is down")

    monkeypatch.setattr(selectors, "poll_debts", down)
    clock.advance()
    with django_assert_num_queries(0):  # the last debts kept: answered from the cache
        assert poll(other.client, other_etag).status_code == 304
    assert agent.agent.token_key in polldebt._debts.indebted()
    assert polldebt.owes(agent.agent.token_key) is True  # the last debts read
    assert etag


# -- the sweep ------------------------------------------------------------------------------


def test_the_sweep_settles_an_invalidation_only_after_its_grace(enroll, first, environment,
                                                                superuser):
    agent = enroll()
    _warm(agent.client)
    PollInvalidation.objects.all().delete()
    publish_variant(environment, superuser, workers=8)

    assert services.poll_invalidations_sweep() == 0
    [row] = PollInvalidation.objects.all()
    assert row.seen_at is not None
    assert services.poll_invalidations_sweep() == 0  # within the grace period
    assert _settle_all() == 1
    assert not PollInvalidation.objects.exists()
    assert selectors.poll_debts() == (frozenset(), [])


def test_the_sweep_keeps_the_invalidation_while_the_cache_fails(enroll, first, environment,
                                                                superuser):
    enroll()
    PollInvalidation.objects.all().delete()
    publish_variant(environment, superuser, workers=8)

    with override_settings(CACHES=CACHE_DOWN):
        assert _settle_all() == 0
    assert PollInvalidation.objects.count() == 1
    assert _settle_all() == 1


def test_the_refreshing_process_sweeps_what_is_due(enroll, first, environment, superuser,
                                                   clock):
    agent = enroll()
    etag = _warm(agent.client)
    publish_variant(environment, superuser, workers=8)
    PollInvalidation.objects.update(
        seen_at=timezone.now() - timedelta(seconds=rules.POLL_DEBT_GRACE_S + 1))
    clock.advance()

    poll(agent.client, etag)

    assert not PollInvalidation.objects.exists()


def test_the_sweep_task_is_scheduled(settings):
    entry = settings.CELERY_BEAT_SCHEDULE["sweep-poll-invalidations"]
    assert entry["task"] == "apps.fleet.tasks.poll_invalidations_sweep_task"
    assert entry["schedule"] <= rules.POLL_DEBT_GRACE_S
