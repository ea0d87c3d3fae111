"""Query parameters, read strictly: one value per parameter (a repeated one is 400),
flags in the spellings FLAG_SPELLINGS lists, numbers in plain ASCII digits, choices
from their list — anything else is `400` naming the parameter, never a guess. An
unsafe request (POST, PUT, PATCH, DELETE) to the API carrying a parameter its view
does not read is refused too (StrictQueryMiddleware): a mistyped `?dry_run` must
not do the real thing."""

from django.http import JsonResponse

from apps.core.errors import ValidationFailed
from apps.core.text import whole_number

FLAG_SPELLINGS = {"1": True, "true": True, "yes": True, "0": False, "false": False, "no": False}
FLAGS_SHOWN = "1, true or yes; 0, false or no"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _refuse(name: str, message: str):
    raise ValidationFailed(f"{name}: {message}", details=[{"field": name, "message": message}])


def query_value(request, name: str) -> str | None:
    """The one value of parameter `name`, or None when it is absent."""
    values = request.query_params.getlist(name)
    if len(values) > 1:
        _refuse(name, "give it once")
    return values[0] if values else None


def query_flag(request, name: str, *, default: bool | None = False) -> bool | None:
    """A yes/no parameter; `default` when absent."""
    value = query_value(request, name)
    if value is None:
        return default
    if value not in FLAG_SPELLINGS:
        _refuse(name, f"use {FLAGS_SHOWN}")
    return FLAG_SPELLINGS[value]


def query_choice(request, name: str, choices: tuple[str, ...], *, default: str) -> str:
    value = query_value(request, name)
    if value is None:
        return default
    if value not in choices:
        _refuse(name, f"use {', '.join(choices)}")
    return value


def query_number(request, name: str, *, maximum: int, default: int | None = None,
                 minimum: int = 0) -> int | None:
    """A whole number from `minimum` to `maximum` in ASCII digits; `default` when
    absent or empty."""
    value = query_value(request, name)
    if value is None or value == "":
        return default
    number = whole_number(value, maximum=maximum)
    if number is None or number < minimum:
        _refuse(name, f"must be a whole number from {minimum} to {maximum} in digits 0-9")
    return number


def unknown_query_parameter(request, view_func) -> str | None:
    """The first query parameter an unsafe API request carries that its view does not
    read (`query_parameters` on the view class), or None."""
    if request.method not in UNSAFE_METHODS or not request.path.startswith("/api/"):
        return None
    view = getattr(view_func, "cls", None) or getattr(view_func, "view_class", None)
    allowed = set(getattr(view, "query_parameters", ()))
    return next((name for name in request.GET if name not in allowed), None)


class StrictQueryMiddleware:
    """Refuse an unsafe API request with a query parameter its view does not read."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_view(self, request, view_func, view_args, view_kwargs):
        name = unknown_query_parameter(request, view_func)
        if name is None:
            return None
        message = "not a parameter of this operation"
        return JsonResponse({"error": {"code": "invalid", "message": f"{name}: {message}",
                                       "details": [{"field": name, "message": message}]}},
                            status=400)
