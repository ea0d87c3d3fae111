"""GET /api/v1/agent/desired answered from the database (agentapi.checks runs the
route's checks first), for the polls the cache cannot answer: agentapi.cached answers
the rest from the poll state this writes.
"""

from django.conf import settings
from django.http import HttpResponse
from django.utils.cache import get_conditional_response
from rest_framework import exceptions

from agentapi import checks
from apps.fleet import cache, heartbeats, selectors

METHODS = ("GET", "HEAD")


def desired_answer(request) -> HttpResponse:
    """The agent's desired state (200), or 304/412 by its ETag."""
    wait = requested_wait(request.scope.get("query_string") or b"")
    if isinstance(wait, tuple):
        raise exceptions.ValidationError({wait[0]: [wait[1]]})
    agent = checks.authenticated_agent(request)
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
