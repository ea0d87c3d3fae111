"""Django-level error handlers: API paths answer with the JSON error envelope."""

import logging
import sys
from urllib.parse import unquote_to_bytes

from django.conf import settings
from django.core.cache import cache
from django.core.exceptions import (
    DisallowedHost,
    RequestDataTooBig,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.db import InterfaceError, OperationalError, connection
from django.http import HttpResponse, HttpResponseRedirect, JsonResponse
from django.templatetags.static import static
from django.views import defaults
from django.views.decorators.csrf import csrf_exempt

from apps.core.text import text_problem, url_text_problem

logger = logging.getLogger(__name__)


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def healthz(request):
    """Liveness for load balancers: the process answers HTTP. Touches nothing else."""
    return HttpResponse("ok\n", content_type="text/plain")


def favicon(request):
    """The icon browsers ask every origin for (pages that link none, like the API's
    JSON): the dashboard's SVG icon, by a redirect to its static, versioned URL."""
    response = HttpResponseRedirect(static("bellwether/favicon.svg"))
    response["Cache-Control"] = "public, max-age=86400"
    return response


def _database_problem() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except (OperationalError, InterfaceError) as exc:
        return str(exc).strip() or type(exc).__name__
    return None


def _redis_problem() -> str | None:
    if not settings.REDIS_URL:
        return None
    try:
        cache.get("readyz")
    except Exception as exc:  # any client error means "not ready"
        return str(exc).strip() or type(exc).__name__
    return None


def readyz(request):
    """Readiness: the database answers, and Redis when one is configured. 503 with
    the error envelope naming what is down (load balancers stop sending traffic)."""
    problems = {name: problem for name, problem in
                (("database", _database_problem()), ("redis", _redis_problem())) if problem}
    if problems:
        logger.warning("not ready: %s", problems)
        return JsonResponse({"error": {
            "code": "unavailable", "message": "Not ready: " + ", ".join(sorted(problems)) + ".",
            "details": [{"dependency": name, "message": problem}
                        for name, problem in sorted(problems.items())]}}, status=503,
            headers={"Retry-After": "5"})
    return JsonResponse({"status": "ready", "database": "ok",
                         "redis": "ok" if settings.REDIS_URL else "not configured"})


class DatabaseUnavailableMiddleware:
    """A view (outside DRF, whose exception handler does the same) that fails
    because the database is down answers 503 at once: the error envelope on API
    paths, a plain page elsewhere."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if not isinstance(exception, OperationalError | InterfaceError):
            return None
        return database_unavailable(request, exception)


def database_unavailable(request, exception) -> HttpResponse:
    """503 for a request the database failed: the error envelope on API paths."""
    logger.warning("database unavailable: %s", exception)
    if _is_api(request):
        return JsonResponse({"error": {
            "code": "unavailable",
            "message": "The database is unavailable; try again shortly."}},
            status=503, headers={"Retry-After": "5"})
    return HttpResponse("Service unavailable: the database is down; try again shortly.\n",
                        content_type="text/plain", status=503,
                        headers={"Retry-After": "5"})


def _bad_request(request, field: str, problem: str):
    message = f"{field}: {problem}"
    if _is_api(request):
        return JsonResponse({"error": {"code": "invalid", "message": message,
                                       "details": [{"field": field, "message": problem}]}},
                            status=400)
    return HttpResponse(f"Bad request: {message}\n", content_type="text/plain", status=400)


FORM_TYPES = ("application/x-www-form-urlencoded", "multipart/form-data")


def _too_much(request, exc, field: str) -> HttpResponse:
    """400 (413 for a body over the size limit) for a request whose query or form
    Django refuses to parse: the envelope naming `query` or `body` on API paths."""
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if _is_api(request):
            return JsonResponse({"error": {"code": "too_large", "message":
                                           f"Request body is over {limit} bytes."}}, status=413)
        return HttpResponse(f"Request body is over {limit} bytes.\n",
                            content_type="text/plain", status=413)
    if isinstance(exc, TooManyFilesSent):
        return _bad_request(request, "body", f"more than "
                            f"{settings.DATA_UPLOAD_MAX_NUMBER_FILES} files")
    return _bad_request(request, field, f"more than "
                        f"{settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} parameters")


def _parsed_or_refused(request) -> HttpResponse | None:
    """Parse the query, and a form body, here, first: Django refuses more than
    DATA_UPLOAD_MAX_NUMBER_FIELDS parameters (or files) by raising wherever they are
    first read — a view, the CSRF middleware, DEBUG's error page (a 500) — so the
    answer is given once, here, naming the query or the body."""
    try:
        request.GET  # noqa: B018 - parsed now, so the refusal is ours
    except TooManyFieldsSent as exc:
        return _too_much(request, exc, "query")
    if request.method in ("GET", "HEAD", "OPTIONS") or request.content_type not in FORM_TYPES:
        return None
    try:
        request.POST  # noqa: B018
    except (TooManyFieldsSent, TooManyFilesSent, RequestDataTooBig) as exc:
        return _too_much(request, exc, "body")
    return None


def _query_problem(query: str) -> tuple[str, str] | None:
    """(parameter, problem) for the first query parameter whose name or value is not
    UTF-8 once percent-decoded (QueryDict would replace the bytes silently)."""
    try:
        raw = query.encode("latin-1")  # WSGI: the bytes as sent
    except UnicodeEncodeError:
        raw = query.encode("utf-8")
    for part in raw.split(b"&"):
        key, _, value = part.partition(b"=")
        key, value = key.replace(b"+", b" "), value.replace(b"+", b" ")
        problem = url_text_problem(key, path=False) or url_text_problem(value, path=False)
        if problem:
            name = unquote_to_bytes(key).decode("utf-8", "backslashreplace")
            return name.replace("\x00", "\\x00") or "query", problem
    return None


class UnstorableTextMiddleware:
    """A URL path or a query parameter holding a NUL (or a lone surrogate), or bytes
    that are not UTF-8 once percent-decoded (or, in a path, U+FFFD), is answered 400
    naming it before any view runs: no view ever looks up or stores such text
    (PostgreSQL cannot hold NUL; SQLite would store it). Control and bidirectional
    characters in paths are the routes' own check (file paths: `invalid_path`)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        # Django re-percent-encodes bytes that are not UTF-8 (WSGI); an ASGI server
        # replaces them with U+FFFD and keeps the bytes in raw_path.
        raw_path = getattr(request, "scope", {}).get("raw_path") or b""
        problem = (text_problem(request.path) or url_text_problem(request.path)
                   or url_text_problem(raw_path))
        if problem:
            return _bad_request(request, "path", problem)
        refused = _query_problem(request.META.get("QUERY_STRING", ""))
        if refused:
            return _bad_request(request, *refused)
        too_much = _parsed_or_refused(request)
        if too_much is not None:
            return too_much
        for key, values in request.GET.lists():
            for value in (key, *values):
                problem = text_problem(value)
                if problem:
                    return _bad_request(request, key.replace("\x00", "\\x00"), problem)
        return self.get_response(request)


@csrf_exempt  # an unknown path is 404 for every method, never the CSRF page
def not_found_api(request, *args, **kwargs):
    return JsonResponse(
        {"error": {"code": "not_found", "message": f"No route for {request.path}."}},
        status=404,
    )


def bad_request(request, exception):
    """handler400 (a SuspiciousOperation, e.g. DisallowedHost for a Host header not
    in ALLOWED_HOSTS): the error envelope on API paths, Django's page elsewhere."""
    if not _is_api(request):
        return defaults.bad_request(request, exception)
    if isinstance(exception, DisallowedHost):
        return _bad_request(request, "Host", "not a host this server answers for")
    return JsonResponse({"error": {"code": "invalid", "message": "Bad request."}},
                        status=400)


def not_found(request, exception):
    if _is_api(request):
        return not_found_api(request)
    return defaults.page_not_found(request, exception)


def server_error(request):
    """handler500. Django calls it inside the `except` of the failure (asgiref keeps
    that across threads), so a database failure raised outside any view — the
    session, auth, messages or CSRF middleware reading or saving the session —
    still answers 503 rather than 500."""
    exception = sys.exc_info()[1]
    if isinstance(exception, OperationalError | InterfaceError):
        return database_unavailable(request, exception)
    if _is_api(request):
        return JsonResponse(
            {"error": {"code": "internal", "message": "Internal server error."}}, status=500
        )
    return defaults.server_error(request)
