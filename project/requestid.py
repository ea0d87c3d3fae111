"""Request ids for the logs: every log line written while a request or a task runs
carries its id (`request_id`; "-" outside both), and every response names it.

The id is the request's X-Request-ID when it is a plain token (letters, digits,
`.`, `_`, `-`, at most 64; what nginx's $request_id or a load balancer sends), so a
line here can be matched with the proxy's; otherwise a new one. A Celery task's
lines carry the task's id.
"""

import contextvars
import logging
import re
import uuid

from celery.signals import task_postrun, task_prerun

HEADER = "X-Request-ID"
_TOKEN = re.compile(r"[A-Za-z0-9._-]{1,64}")
current = contextvars.ContextVar("request_id", default="-")


def request_id_of(request) -> str:
    """The id of this request: the one it brought when well-formed, else a new one."""
    presented = request.headers.get(HEADER, "")
    return presented if _TOKEN.fullmatch(presented) else uuid.uuid4().hex


class RequestIdMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = request_id_of(request)
        token = current.set(request.request_id)
        try:
            response = self.get_response(request)
        finally:
            current.reset(token)
        response[HEADER] = request.request_id
        return response


class RequestIdFilter(logging.Filter):
    def filter(self, record):
        record.request_id = current.get()
        return True


_task_tokens: dict[str, contextvars.Token] = {}


@task_prerun.connect
def _task_started(task_id=None, **kwargs):
    _task_tokens[task_id] = current.set(task_id or "-")


@task_postrun.connect
def _task_ended(task_id=None, **kwargs):
    token = _task_tokens.pop(task_id, None)
    if token is not None:
        current.reset(token)
