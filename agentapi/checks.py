"""An agent route's answer from the database, and the checks every route makes first.

It runs on a thread admission lends (`answered_on_thread`), with Django's request
object (its Host, HTTPS and conditional request rules), and each check is the
function the rest of the API uses: the address refused for failed authentications,
Django's HTTPS redirect, the agent token (`AgentTokenAuthentication`), the agent's
API rate (`AgentRateThrottle`), the error envelope (`apps.core.api.exception_handler`).
"""

import io
import logging
from collections.abc import Callable

from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.middleware.security import SecurityMiddleware
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer

from apps.core import api
from apps.core.errors import ApplicationError
from apps.core.throttling import AgentRateThrottle, FailedAuthenticationMiddleware
from apps.fleet.authentication import AgentTokenAuthentication
from project.admission import Busy, admission, busy
from project.requestid import RequestIdMiddleware

Answer = Callable[[ASGIRequest], HttpResponse]


async def answered_on_thread(scope, send, methods: tuple[str, ...], answer: Answer,
                             body: bytes = b"") -> int:
    """Send the route's answer from the database (`answered`, on a thread admission
    lends, or 503 when none is free soon); its status."""
    try:
        response = await admission.run(answered, scope, methods, answer, body)
    except Busy:
        await busy(send)
        return 503
    await send_response(send, response)
    return response.status_code


def answered(scope, methods: tuple[str, ...], answer: Answer, body: bytes = b"") -> HttpResponse:
    """`answer(request)` once the route's checks pass, else the check's refusal;
    with the request's id (logged with it too), through the API's own middleware for
    the request id and the addresses refused for failed authentications."""
    request = ASGIRequest(scope, io.BytesIO(body))
    response = RequestIdMiddleware(FailedAuthenticationMiddleware(
        lambda request: _checked(request, methods, answer)))(request)
    if request.method == "HEAD":
        response.content = b""
    return response


def _checked(request, methods, answer) -> HttpResponse:
    if request.method not in methods:
        response = error_json(exceptions.MethodNotAllowed(request.method))
        response["Allow"] = ", ".join(methods)
        return response
    try:
        request.get_host()
        # Made per request: it reads its settings when made.
        response = SecurityMiddleware(lambda request: None).process_request(request)
        if response is None:
            response = answer(request)
    except DisallowedHost as exc:
        logging.getLogger("django.security.DisallowedHost").warning("%s", exc)
        response = error_json(exceptions.ValidationError({"Host": ["not allowed here"]}))
    except (ApplicationError, exceptions.APIException, OperationalError, InterfaceError) as exc:
        response = error_json(exc)
    return response


def authenticated_agent(request, *, counted: bool = False):
    """The agent whose token the request presents, within its API rate (unless the
    request was `counted` against it already); else AuthenticationFailed (401) or
    Throttled (429)."""
    authentication = AgentTokenAuthentication()
    try:
        request.user, agent = authentication.authenticate(request)
    except exceptions.AuthenticationFailed as exc:
        exc.auth_header = authentication.authenticate_header(request)  # as DRF's views
        raise
    throttle = AgentRateThrottle()
    if not counted and not throttle.allow_request(request, None):
        raise exceptions.Throttled(throttle.wait())
    return agent


def error_json(exc) -> HttpResponse:
    """The API's answer to `exc` (the error envelope), as the bytes DRF renders."""
    response = api.exception_handler(exc, {})
    answer = HttpResponse(JSONRenderer().render(response.data), status=response.status_code,
                          content_type="application/json")
    for name, value in response.headers.items():
        if name.lower() != "content-type":
            answer[name] = value
    return answer


async def send_response(send, response: HttpResponse) -> None:
    """Send a Django HttpResponse (its headers and content) as the ASGI answer."""
    await send({"type": "http.response.start", "status": response.status_code, "headers": [
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in response.items()]})
    await send({"type": "http.response.body", "body": response.content})
