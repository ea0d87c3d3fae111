"""Set-based writes: `INSERT … SELECT` from a queryset, the one place of raw SQL for
writing many rows, and many ids as one parameter. The ORM's bulk_create sends
every row from Python in batches (a number of statements that grows with the
rows); here the database copies them in one statement, whatever their number, on
SQLite and PostgreSQL alike."""

import json

from django.db import connections
from django.db.models import BigIntegerField, Expression, TextField


def insert_from_select(model, fields: list[str], rows) -> int:
    """Insert into `model` one row per row of `rows`, a `values_list` queryset of
    `model`'s `fields` (attribute names, e.g. "agent_id") in that order. Returns
    how many rows were written."""
    select = rows.order_by()
    connection = connections[select.db]
    quote = connection.ops.quote_name
    columns = ", ".join(quote(model._meta.get_field(name).column) for name in fields)
    sql, params = select.query.get_compiler(using=select.db).as_sql()
    if len(select.query.values_select) + len(select.query.annotation_select) != len(fields):
        raise ValueError(f"{len(fields)} fields to insert but the query selects otherwise")
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {quote(model._meta.db_table)} ({columns}) {sql}", params)
        return cursor.rowcount


class _ListParameter(Expression):
    """Values as one parameter of a subquery: a PostgreSQL array of `array_type`,
    JSON text on SQLite."""

    def __init__(self, values: list, output_field, array_type: str):
        super().__init__(output_field=output_field)
        self.values, self.array_type = values, array_type

    def as_sql(self, compiler, connection):
        return "SELECT value FROM json_each(%s)", [json.dumps(self.values)]

    def as_postgresql(self, compiler, connection):
        return f"SELECT unnest(%s::{self.array_type}[])", [self.values]


def _listed(values) -> bool:
    # A queryset is never tested for truth here: that would run it.
    return isinstance(values, (list, tuple, set, frozenset)) and bool(values)


def ids_in(ids):
    """`ids` for an `__in` lookup (`filter(pk__in=ids_in(ids))`): a list of ids as
    one parameter, a queryset of ids (or no ids: no query is sent) as it is.
    `IN (%s, %s, …)` costs Django and the driver a placeholder each to build and
    parse: a quarter of a 10,000-target rollout's create was spent so
    (bench/rollout_waves.py)."""
    if _listed(ids):
        return _ListParameter([int(each) for each in ids], BigIntegerField(), "bigint")
    return ids


def texts_in(texts):
    """ids_in for text values (`filter(token_key__in=texts_in(keys))`): half of a
    refill's time for 10,000 agents went to `IN` lists of token keys and ids."""
    if _listed(texts):
        return _ListParameter([str(each) for each in texts], TextField(), "text")
    return texts
