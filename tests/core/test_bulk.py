"""Many ids or texts as one parameter (`__among`, apps.core.bulk.Among), and
timestamps read as seconds (`Epoch`), on SQLite and PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models import Case, F, Max, Value, When
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.core.bulk import Epoch
from apps.fleet.models import Agent
from apps.fleet.selectors import desired_states_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def agents(environment):
    Agent.objects.bulk_create([
        Agent(environment=environment, name=f"bulk-{i}", token_key=f"bulk{i:012d}",
              token_hash="0" * 64) for i in range(1_200)])
    return list(Agent.objects.filter(environment=environment).order_by("pk")
                .values_list("pk", flat=True))


def test_a_list_of_ids_selects_exactly_those_rows(agents):
    chosen = agents[3:1_103:2]
    assert sorted(Agent.objects.filter(pk__among=chosen)
                  .values_list("pk", flat=True)) == sorted(chosen)


def test_however_many_ids_the_statement_has_one_parameter(agents):
    few = Agent.objects.filter(pk__among=agents[:2]).order_by()
    many = Agent.objects.filter(pk__among=agents).order_by()
    assert len(few.query.sql_with_params()[1]) == len(many.query.sql_with_params()[1]) == 1
    assert many.count() == len(agents)


def test_an_update_through_it_changes_only_those_rows(agents):
    chosen = set(agents[::3])
    assert Agent.objects.filter(pk__among=chosen).update(
        generation=F("generation") + 1) == len(chosen)
    bumped = set(Agent.objects.filter(generation=2).values_list("pk", flat=True))
    assert bumped == chosen


def test_no_ids_select_nothing_without_a_query(agents, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert list(Agent.objects.filter(pk__among=[])) == []


def test_a_query_of_ids_is_a_subquery(agents):
    subquery = Agent.objects.filter(pk__lte=agents[9]).values("pk")
    chosen = Agent.objects.filter(pk__among=subquery)
    assert "IN (SELECT" in str(chosen.query)
    assert chosen.count() == 10


def test_ids_that_are_not_numbers_are_refused_before_the_database(
        agents, django_assert_num_queries):
    with django_assert_num_queries(0), pytest.raises(ValueError):
        Agent.objects.filter(pk__among=["1; DROP TABLE fleet_agent"])


def test_values_neither_numbers_nor_texts_are_refused(agents):
    with pytest.raises(TypeError, match="whole numbers or texts"):
        list(Agent.objects.filter(last_seen_at__among=[timezone.now()]))


def test_a_query_of_ids_is_not_run_to_be_passed_on(agents, django_assert_num_queries):
    with django_assert_num_queries(0):
        Agent.objects.filter(pk__among=Agent.objects.values("pk"))


def test_it_chooses_the_rows_of_a_wave_inside_a_case(agents):
    chosen = set(agents[10:20])
    waves = dict(Agent.objects.annotate(wave=Case(When(pk__among=chosen, then=Value(1)),
                                                  default=Value(2)))
                 .values_list("pk", "wave"))
    assert {pk for pk, wave in waves.items() if wave == 1} == chosen


def test_a_list_of_texts_selects_exactly_those_rows_in_one_parameter(agents):
    keys = [f"bulk{i:012d}" for i in range(0, 1_200, 7)]
    chosen = Agent.objects.filter(token_key__among=keys).order_by()
    assert len(chosen.query.sql_with_params()[1]) == 1
    assert sorted(chosen.values_list("token_key", flat=True)) == keys


@pytest.mark.parametrize("hostile", ["a'b", "x\"); DROP TABLE fleet_agent; --", "{1,2}",
                                     "NULL", "ü" * 300, ""])
def test_texts_are_values_never_sql(agents, hostile):
    assert list(Agent.objects.filter(token_key__among=[hostile, "bulk000000000002"])
                .values_list("token_key", flat=True)) == ["bulk000000000002"]
    assert Agent.objects.count() == len(agents)


def test_no_texts_select_nothing_without_a_query(agents, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert list(Agent.objects.filter(token_key__among=set())) == []


@pytest.mark.postgres
def test_values_are_tested_once_a_row_whatever_join_the_planner_picks(agents):
    """A fleet enrolled minutes ago has no statistics yet (ANALYZE comes later, or
    never with autovacuum off): the planner takes the agents' table for tiny and
    may join it with the values by a nested loop, every row against every value
    (2.3 s for a refill's 1,000 agents of 10,000). Forced here; the values must
    not be a join at all."""
    keys = [f"bulk{i:012d}" for i in range(0, 1_200, 2)]
    with CaptureQueriesContext(connection) as read:
        assert sorted(agent.token_key for agent, _, _ in desired_states_of(keys)) == keys
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_hashjoin = off")
        cursor.execute("SET LOCAL enable_mergejoin = off")
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {read.captured_queries[0]['sql']}")
        plan = cursor.fetchone()[0]

    def joined_away(node):
        return (node.get("Rows Removed by Join Filter", 0)
                + sum(joined_away(child) for child in node.get("Plans", ())))

    assert joined_away(plan[0]["Plan"]) < len(agents)


def test_timestamps_read_as_seconds_keep_the_microsecond_and_the_order(agents):
    """What the evidence compares: a microsecond apart stays apart and in order,
    a whole second has no fraction, none is None, an aggregate can be read so."""
    base = datetime(2026, 12, 5, 10, 0, 0, tzinfo=UTC)
    times = [base, base + timedelta(microseconds=1), base + timedelta(microseconds=2),
             base + timedelta(seconds=1, microseconds=999_999), None]
    for pk, at in zip(agents, times, strict=False):
        Agent.objects.filter(pk=pk).update(last_seen_at=at)

    read = dict(Agent.objects.filter(pk__among=agents[:5])
                .annotate(seen_s=Epoch("last_seen_at")).values_list("pk", "seen_s"))
    seconds = [read[pk] for pk in agents[:5]]

    assert seconds[4] is None
    assert seconds[:4] == sorted(seconds[:4]) and len(set(seconds[:4])) == 4
    for at, second in zip(times[:4], seconds[:4], strict=True):
        assert abs(second - at.timestamp()) < 5e-7
    assert seconds[0] == base.timestamp()
    latest = Agent.objects.filter(pk__among=agents[:5]).aggregate(
        latest=Epoch(Max("last_seen_at")))["latest"]
    assert latest == seconds[3]
