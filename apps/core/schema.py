"""The OpenAPI schema's error answers, in one place: a drf-spectacular
postprocessing hook documents the 4xx/5xx answers of every operation with the
error envelope of docs/design.md (`{"error": {"code", "message", "details"}}`)."""

ENVELOPE = {
    "type": "object",
    "description": "Every API error: a stable `code`, a `message` for people, and "
                   "`details` naming the field, file, line or key where it applies.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {
                "code": {"type": "string"},
                "message": {"type": "string"},
                "details": {"type": "array", "items": {}},
            },
        },
    },
}

# status -> (what it means, which operations answer it)
ERRORS = {
    400: "Bad input, named in `details` (field, file, line or key); `render_limit` when a "
         "render went over its budget.",
    401: "No token, or an unknown, expired or revoked one.",
    403: "Authenticated, but the role does not allow it.",
    404: "Not found, or not visible to this token.",
    409: "A conflict: the state changed, a compare-and-set did not match, or a bound "
         "was reached.",
    413: "The request body is over the size limit.",
    429: "Throttled; `Retry-After` says when to try again.",
    503: "A dependency is down or too many renders run at once; `Retry-After` says when "
         "to try again.",
}
_BODY_METHODS = {"post", "put", "patch"}
_METHODS = _BODY_METHODS | {"get", "delete"}


def _statuses(path: str, method: str) -> list[int]:
    statuses = [400, 401, 403, 404, 429, 503]  # 404: in the path, or named by the body
    if method != "get":
        statuses.append(409)
    if method in _BODY_METHODS:
        statuses.append(413)
    return sorted(statuses)


def error_responses(result, generator, request, public):
    """drf-spectacular POSTPROCESSING_HOOKS entry: add the error answers each
    operation can give (keeping any an operation documents itself)."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ENVELOPE
    ref = {"$ref": "#/components/schemas/Error"}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if method not in _METHODS:
                continue
            responses = operation.setdefault("responses", {})
            for status in _statuses(path, method):
                responses.setdefault(str(status), {
                    "description": ERRORS[status],
                    "content": {"application/json": {"schema": ref}},
                })
    return result
