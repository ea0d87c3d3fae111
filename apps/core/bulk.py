"""Set-based SQL: `INSERT … SELECT` from a queryset, the one place of raw SQL for
writing many rows, `__among`, many ids or texts as one parameter, and `Epoch`,
many timestamps read as numbers. The ORM's bulk_create sends every row from
Python in batches (a number of statements that grows with the rows); here the
database copies them in one statement, whatever their number, on SQLite and
PostgreSQL alike. `__among` is registered on every field (apps.core.apps)."""

import json

from django.core.exceptions import EmptyResultSet
from django.db import connections
from django.db.models import FloatField, Func, Lookup
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


class Epoch(Func):
    """A timestamp as seconds since 1970-01-01 UTC (a float, to the microsecond),
    for reads of many timestamps that only compare them: Django loads a PostgreSQL
    timestamptz through a Python function per value (20,000 in 119 ms; as float8
    26 ms). NULL stays NULL."""

    output_field = FloatField()
    arity = 1

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection,
                           template="EXTRACT(EPOCH FROM %(expressions)s)::float8", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        # Stored as text, "YYYY-MM-DD HH:MM:SS[.ffffff]" in UTC; SQLite's own date
        # functions round to the millisecond (.999999 s becomes the next second), so
        # they read the whole seconds and the fraction is read from the text.
        sql, params = compiler.compile(self.source_expressions[0])
        return (f"(CAST(strftime('%%s', substr({sql}, 1, 19)) AS REAL)"
                f" + CAST(substr({sql}, 20) AS REAL))", [*params, *params])
