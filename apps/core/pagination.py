"""Pagination with bounded numbers: `limit` is clamped to MAX_LIMIT, and an `offset`
or `limit` that is not a small whole number is a 400 naming it (a huge one would
overflow SQLite's and PostgreSQL's LIMIT/OFFSET)."""

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import LimitOffsetPagination

MAX_LIMIT = 500
MAX_OFFSET = 10**9


def _bounded(request, name: str, default: int, maximum: int, *, clamp: bool) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 20:
        raise ValidationError({name: ["Must be a whole number of at least 0."]})
    value = int(raw)
    if value > maximum:
        if not clamp:
            raise ValidationError({name: [f"Must be at most {maximum}."]})
        value = maximum
    return value


class BoundedLimitOffsetPagination(LimitOffsetPagination):
    max_limit = MAX_LIMIT

    def get_limit(self, request):
        limit = _bounded(request, self.limit_query_param, self.default_limit, self.max_limit,
                         clamp=True)
        return limit or self.default_limit

    def get_offset(self, request):
        return _bounded(request, self.offset_query_param, 0, MAX_OFFSET, clamp=False)
