"""Django-level error handlers: API paths answer with the JSON error envelope."""

from django.http import HttpResponse, JsonResponse
from django.views import defaults


def _is_api(request) -> bool:
    return request.path.startswith("/api/")


def healthz(request):
    """Liveness for load balancers: the process answers HTTP. Touches nothing else."""
    return HttpResponse("ok\n", content_type="text/plain")


def not_found_api(request, *args, **kwargs):
    return JsonResponse(
        {"error": {"code": "not_found", "message": f"No route for {request.path}."}},
        status=404,
    )


def not_found(request, exception):
    if _is_api(request):
        return not_found_api(request)
    return defaults.page_not_found(request, exception)


def server_error(request):
    if _is_api(request):
        return JsonResponse(
            {"error": {"code": "internal", "message": "Internal server error."}}, status=500
        )
    return defaults.server_error(request)
