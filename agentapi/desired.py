"""GET /api/v1/agent/desired answered from the database: the route's every check and
its answer, for the polls the cache cannot answer (agentapi.edge answers the rest
from the poll state this writes).

It runs on a thread with Django's request object (its Host, HTTPS and conditional
request rules), and each check is the function the rest of the API uses: Django's
HTTPS redirect, the address refused for failed authentications, the agent token
(`AgentTokenAuthentication`), the agent's API rate (`AgentRateThrottle`), the error
envelope (`apps.core.api.exception_handler`).
"""

import io
import logging
import time

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.core.handlers.asgi import ASGIRequest
from django.db import InterfaceError, OperationalError
from django.http import HttpResponse
from django.middleware.security import SecurityMiddleware
from django.utils.cache import get_conditional_response
from rest_framework import exceptions
from rest_framework.renderers import JSONRenderer

from apps.core import api, throttling
from apps.core.throttling import AgentRateThrottle
from apps.fleet import cache, heartbeats, selectors
from apps.fleet.authentication import AgentTokenAuthentication
from project import requestid

ALLOWED_METHODS = ("GET", "HEAD")


def answered_from_database(scope) -> HttpResponse:
    """The route's answer to this request, with its request id (logged with it)."""
    request = ASGIRequest(scope, io.BytesIO())
    request_id = requestid.request_id_of(request)
    token = requestid.current.set(request_id)
    try:
        response = _checked_answer(request)
    finally:
        requestid.current.reset(token)
    response[requestid.HEADER] = request_id
    if request.method == "HEAD":
        response.content = b""
    return response


def _checked_answer(request) -> HttpResponse:
    address = throttling.client_ip(request)
    blocked = throttling.blocked_addresses.wait(address, time.time())
    if blocked is not None:
        return throttling.blocked_answer(blocked)
    if request.method not in ALLOWED_METHODS:
        response = error_json(exceptions.MethodNotAllowed(request.method))
        response["Allow"] = ", ".join(ALLOWED_METHODS)
        return response
    try:
        response = _answer(request)
    except DisallowedHost as exc:
        logging.getLogger("django.security.DisallowedHost").warning("%s", exc)
        response = error_json(exceptions.ValidationError({"Host": ["not allowed here"]}))
    except (exceptions.APIException, OperationalError, InterfaceError) as exc:
        response = error_json(exc)
    if throttling.presented_credential_refused(request, response):
        throttling.authentication_failed(address)
    return response


def _answer(request) -> HttpResponse:
    request.get_host()
    # Made per request: it reads its settings when made.
    redirect = SecurityMiddleware(lambda request: None).process_request(request)
    if redirect is not None:
        return redirect
    wait = requested_wait(request.scope.get("query_string") or b"")
    if isinstance(wait, tuple):
        raise exceptions.ValidationError({wait[0]: [wait[1]]})
    request.user, agent = AgentTokenAuthentication().authenticate(request)
    throttle = AgentRateThrottle()
    if not throttle.allow_request(request, None):
        raise exceptions.Throttled(throttle.wait())
    etag, body = desired_stored(agent)
    heartbeats.heartbeat_record(agent.pk)  # its state was just written
    response = get_conditional_response(request, etag=etag)
    if response is None:
        response = HttpResponse(body, content_type="application/json")
    response["ETag"], response["Cache-Control"] = etag, "no-cache"
    for name, value in long_poll_header():
        response[name.decode()] = value.decode()
    return response


def requested_wait(query: bytes) -> int | tuple[str, str]:
    """Seconds the poll may be held (0 without a query string), or (parameter, what
    is wrong): the query is at most `wait=N`, given once, N a whole number in ASCII
    digits (more than BELLWETHER_LONG_POLL_MAX_S is served as that)."""
    if not query:
        return 0
    parameters = query.split(b"&")
    if len(parameters) > settings.DATA_UPLOAD_MAX_NUMBER_FIELDS:
        return "query", f"more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} parameters"
    for parameter in parameters:
        name = parameter.partition(b"=")[0]
        if name != b"wait":
            shown = name.decode("ascii") if name.isascii() and name.isalnum() else "query"
            return shown, "not a parameter of this operation"
    if len(parameters) > 1:
        return "wait", "give it once"
    digits = parameters[0].partition(b"=")[2]
    if not (digits.isascii() and digits.isdigit()):
        return "wait", "must be a whole number of seconds in digits 0-9"
    cap, digits = settings.BELLWETHER_LONG_POLL_MAX_S, digits.lstrip(b"0")
    return cap if len(digits) > 6 else min(int(digits or 0), cap)


def desired_stored(agent) -> tuple[str, bytes]:
    """The agent's desired answer (ETag, body) from the database, written to its poll
    state for the next polls (and dropped again when a change committed meanwhile
    made it stale)."""
    body, etag = selectors.desired_state_for(agent)
    rendered = selectors.desired_body_bytes(body)
    # The generation read with the agent's row: what the answer reflects at least.
    cache.store_poll_state(token_key=agent.token_key, token_hash=agent.token_hash,
                           agent_id=agent.pk, environment_id=agent.environment_id,
                           etag=etag, generation=agent.generation, body=rendered)
    if not selectors.poll_state_current(agent.pk, token_key=agent.token_key, etag=etag):
        cache.forget_poll_states([agent.token_key])
    return etag, rendered


def long_poll_header() -> list[tuple[bytes, bytes]]:
    cap = settings.BELLWETHER_LONG_POLL_MAX_S
    return [(b"bellwether-long-poll", str(cap).encode())] if cap else []


def error_json(exc) -> HttpResponse:
    """The API's answer to `exc` (the error envelope), as the bytes DRF renders."""
    response = api.exception_handler(exc, {})
    answer = HttpResponse(JSONRenderer().render(response.data), status=response.status_code,
                          content_type="application/json")
    for name, value in response.headers.items():
        if name.lower() != "content-type":
            answer[name] = value
    return answer
