"""Set-based inserts: `INSERT … SELECT` from a queryset, the one place of raw SQL for
writing many rows. The ORM's bulk_create sends every row from Python in batches (a
number of statements that grows with the rows); here the database copies them in
one statement, whatever their number, on SQLite and PostgreSQL alike."""

from django.db import connections


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
