"""The benchmarks' baseline: a bare Django view answering 304, WSGI, no middleware,
no apps (served by `granian --interface wsgi bench.bare_django:application`)."""

import django
from django.conf import settings
from django.http import HttpResponse, HttpResponseNotModified
from django.urls import path

ETAG = '"bench"'


def not_modified(request):
    if request.headers.get("If-None-Match") == ETAG:
        response = HttpResponseNotModified()
    else:
        response = HttpResponse("{}", content_type="application/json")
    response["ETag"] = ETAG
    return response


settings.configure(DEBUG=False, ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__, MIDDLEWARE=[],
                   INSTALLED_APPS=[], SECRET_KEY="bench-only-not-a-secret")
django.setup()
urlpatterns = [path("poll", not_modified)]

from django.core.wsgi import get_wsgi_application  # noqa: E402 - after settings

application = get_wsgi_application()
