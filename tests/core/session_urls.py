"""A URLconf for tests/core/test_readiness.py: views that only touch the session, so a
database failure happens in the session middleware after the view returned."""

from django.http import HttpResponse, JsonResponse
from django.urls import path


def remember(request):
    request.session["seen"] = True  # saved by SessionMiddleware, after this view
    return HttpResponse("ok")


def remember_api(request):
    request.session["seen"] = True
    return JsonResponse({"ok": True})


urlpatterns = [path("page/", remember), path("api/v1/page", remember_api)]
handler500 = "apps.core.handlers.server_error"
