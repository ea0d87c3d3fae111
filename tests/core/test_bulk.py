"""Many ids or texts as one parameter (apps.core.bulk.ids_in, texts_in), on SQLite
and PostgreSQL."""

import pytest
from django.db.models import F

from apps.core.bulk import ids_in, texts_in
from apps.fleet.models import Agent

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
    assert sorted(Agent.objects.filter(pk__in=ids_in(chosen))
                  .values_list("pk", flat=True)) == sorted(chosen)


def test_however_many_ids_the_statement_has_one_parameter(agents):
    few = Agent.objects.filter(pk__in=ids_in(agents[:2])).order_by()
    many = Agent.objects.filter(pk__in=ids_in(agents)).order_by()
    assert len(few.query.sql_with_params()[1]) == len(many.query.sql_with_params()[1]) == 1
    assert many.count() == len(agents)


def test_an_update_through_it_changes_only_those_rows(agents):
    chosen = set(agents[::3])
    assert Agent.objects.filter(pk__in=ids_in(chosen)).update(
        generation=F("generation") + 1) == len(chosen)
    bumped = set(Agent.objects.filter(generation=2).values_list("pk", flat=True))
    assert bumped == chosen


def test_no_ids_select_nothing_without_a_query(agents, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert list(Agent.objects.filter(pk__in=ids_in([]))) == []


def test_a_query_of_ids_is_used_as_it_is(agents):
    subquery = Agent.objects.filter(pk__lte=agents[9]).values("pk")
    assert ids_in(subquery) is subquery
    assert Agent.objects.filter(pk__in=ids_in(subquery)).count() == 10


def test_ids_that_are_not_numbers_are_refused_before_the_database(agents):
    with pytest.raises(ValueError):
        ids_in(["1; DROP TABLE fleet_agent"])


def test_a_query_of_ids_is_not_run_to_be_passed_on(agents, django_assert_num_queries):
    with django_assert_num_queries(0):
        ids_in(Agent.objects.values("pk"))


def test_a_list_of_texts_selects_exactly_those_rows_in_one_parameter(agents):
    keys = [f"bulk{i:012d}" for i in range(0, 1_200, 7)]
    chosen = Agent.objects.filter(token_key__in=texts_in(keys)).order_by()
    assert len(chosen.query.sql_with_params()[1]) == 1
    assert sorted(chosen.values_list("token_key", flat=True)) == keys


@pytest.mark.parametrize("hostile", ["a'b", "x\"); DROP TABLE fleet_agent; --", "{1,2}",
                                     "NULL", "ü" * 300, ""])
def test_texts_are_values_never_sql(agents, hostile):
    assert list(Agent.objects.filter(token_key__in=texts_in([hostile, "bulk000000000002"]))
                .values_list("token_key", flat=True)) == ["bulk000000000002"]
    assert Agent.objects.count() == len(agents)


def test_no_texts_select_nothing_without_a_query(agents, django_assert_num_queries):
    with django_assert_num_queries(0):
        assert list(Agent.objects.filter(token_key__in=texts_in(set()))) == []
