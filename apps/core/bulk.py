"""Set-based writes: `INSERT … SELECT` from a queryset, the one place of raw SQL for
writing many rows, and many ids as one parameter. The ORM's bulk_create sends
every row from Python in batches (a number of statements that grows with the
rows); here the database copies them in one statement, whatever their number, on
SQLite and PostgreSQL alike."""

import json

from django.db import connections
from django.db.models import BigIntegerField, Expression


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


class _IdsParameter(Expression):
    """Ids as one parameter of a subquery: a PostgreSQL array, JSON text on SQLite."""

    def __init__(self, ids: list[int]):
        super().__init__(output_field=BigIntegerField())
        self.ids = ids

    def as_sql(self, compiler, connection):
        return "SELECT value FROM json_each(%s)", [json.dumps(self.ids)]

    def as_postgresql(self, compiler, connection):
        return "SELECT unnest(%s::bigint[])", [self.ids]


def ids_in(ids):
    """`ids` for an `__in` lookup (`filter(pk__in=ids_in(ids))`): a list of ids as
    one parameter, a queryset of ids (or no ids: no query is sent) as it is.
    `IN (%s, %s, …)` costs Django and the driver a placeholder each to build and
    parse: a quarter of a 10,000-target rollout's create was spent so
    (bench/rollout_waves.py)."""
    if isinstance(ids, (list, tuple, set, frozenset)) and ids:
        return _IdsParameter([int(each) for each in ids])
    return ids
