"""The single exception handler: every API error leaves as the error envelope of docs/design.md."""

import logging

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from apps.core.errors import ApplicationError

logger = logging.getLogger(__name__)

_DRF_CODES = {
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
    exceptions.ParseError: "parse_error",
    exceptions.ValidationError: "invalid",
}


UNAVAILABLE = "The database is unavailable; try again shortly."


def error_response(status_code: int, code: str, message: str, details=None, headers=None):
    body = {"error": {"code": code, "message": message}}
    if details is not None:  # always a list (docs/design.md): one object is a list of one
        body["error"]["details"] = [details] if isinstance(details, dict) else details
    return Response(body, status=status_code, headers=headers)


def _flatten(detail, prefix: str = "") -> list[dict]:
    """Turn DRF's nested validation detail into a flat list naming each field."""
    if isinstance(detail, dict):
        items = []
        for key, value in detail.items():
            if isinstance(key, int):  # a ListField's item: files[3], as a list's
                items.extend(_flatten(value, f"{prefix}[{key}]"))
                continue
            name = key if key != "non_field_errors" else ""
            items.extend(_flatten(value, f"{prefix}.{name}".strip(".") if name else prefix))
        return items
    if isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            return [{"field": prefix or None, "message": str(item)} for item in detail]
        items = []
        for index, value in enumerate(detail):
            items.extend(_flatten(value, f"{prefix}[{index}]"))
        return items
    return [{"field": prefix or None, "message": str(detail)}]


def exception_handler(exc, context):
    if isinstance(exc, ApplicationError):
        set_rollback()
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        if getattr(exc, "retry_after", None):
            headers = {"Retry-After": str(exc.retry_after)}
        response = error_response(exc.status, exc.code, exc.message, exc.details, headers)
        response.credential_refused = exc.credential_refused
        return response
    if isinstance(exc, OperationalError | InterfaceError):
        set_rollback()
        logger.warning("database unavailable: %s", exc)
        return error_response(503, "unavailable", UNAVAILABLE, headers={"Retry-After": "5"})
    if isinstance(exc, RequestDataTooBig):
        limit = getattr(exc, "limit", settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
        return error_response(413, "too_large", f"Request body is over {limit} bytes.")
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    if isinstance(exc, exceptions.APIException):
        set_rollback()
        headers = {}
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))
        code = next((c for cls, c in _DRF_CODES.items() if isinstance(exc, cls)), "error")
        if isinstance(exc, exceptions.ValidationError):
            details = _flatten(exc.detail)
            first = details[0] if details else {"field": None, "message": "Invalid input."}
            message = (
                f"{first['field']}: {first['message']}" if first["field"] else first["message"]
            )
            return error_response(exc.status_code, code, message, details, headers)
        return error_response(exc.status_code, code, str(exc.detail), None, headers)

    logger.exception("Unhandled error in API view %s", context.get("view"))
    return error_response(
        status.HTTP_500_INTERNAL_SERVER_ERROR, "internal", "Internal server error."
    )
