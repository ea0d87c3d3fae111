"""Set-based SQL: `INSERT … SELECT` from a queryset, the one place of raw SQL for
writing many rows, and `__among`, many ids or texts as one parameter. The ORM's
bulk_create sends every row from Python in batches (a number of statements that
grows with the rows); here the database copies them in one statement, whatever
their number, on SQLite and PostgreSQL alike. `__among` is registered on every
field (apps.core.apps)."""

import json

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import Lookup
from django.db.models.lookups import In


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


class Among(Lookup):
    """`filter(pk__among=ids)`, `filter(token_key__among=keys)`: the rows whose value
    is one of a list of whole numbers or texts, the list sent as one parameter (a
    PostgreSQL array, JSON text on SQLite) however long it is; a queryset of values
    is used as `IN (subquery)`. No list: no rows, and no query is sent.

    Not `IN (%s, %s, …)`: a placeholder each costs Django and the driver (a quarter
    of a 10,000-target rollout's create, bench/rollout_waves.py). Not `IN (SELECT
    unnest(%s))` either: PostgreSQL plans that as a join, and on a table whose
    statistics are missing or stale (a fleet enrolled minutes ago, before ANALYZE)
    as a nested loop testing every row against every value: 2.3 s to read 1,000
    agents of 10,000 for a refill, 12 ms as `= ANY(%s)` (docs/benchmarks.md)."""

    lookup_name = "among"
    prepare_rhs = False

    def get_prep_lookup(self):
        if hasattr(self.rhs, "resolve_expression"):
            return self.rhs
        field = self.lhs.output_field
        return [field.get_prep_value(value) for value in self.rhs]

    def as_sql(self, compiler, connection):
        if hasattr(self.rhs, "resolve_expression"):
            return compiler.compile(In(self.lhs, self.rhs))
        if not self.rhs:
            raise EmptyResultSet
        lhs, params = self.process_lhs(compiler, connection)
        numbers = all(type(value) is int for value in self.rhs)
        if not numbers and not all(isinstance(value, str) for value in self.rhs):
            raise TypeError("among takes whole numbers or texts")
        if connection.vendor == "postgresql":
            return (f"{lhs} = ANY(%s::{'bigint' if numbers else 'text'}[])",
                    [*params, list(self.rhs)])
        return f"{lhs} IN (SELECT value FROM json_each(%s))", [*params, json.dumps(self.rhs)]
