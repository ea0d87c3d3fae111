"""Pagination with bounded numbers: `limit` is clamped to MAX_LIMIT, and an `offset`
or `limit` that is not a small whole number is a 400 naming it (a huge one would
overflow SQLite's and PostgreSQL's LIMIT/OFFSET)."""

from rest_framework.pagination import LimitOffsetPagination

from apps.core.queries import query_number

MAX_LIMIT = 500
MAX_OFFSET = 10**9


def _bounded(request, name: str, default: int, maximum: int, *, clamp: bool) -> int:
    # Clamped: read up to any size of digits the rule allows, then cut to `maximum`.
    value = query_number(request, name, maximum=10**20 if clamp else maximum,
                         default=default)
    return min(value, maximum)


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        limit = _bounded(request, self.limit_query_param, self.default_limit, self.max_limit,
                         clamp=True)
        return limit or self.default_limit

    def get_offset(self, request):
        return _bounded(request, self.offset_query_param, 0, MAX_OFFSET, clamp=False)
