"""Domain errors: services raise these, the API maps them to the error envelope."""

from typing import Any


class ApplicationError(Exception):
    """A refusal the caller can act on. `code` is stable, `message` is for people."""

    status = 400
    code = "invalid"
    # A refusal of a credential the caller presented (a token in the body): counted
    # against its address like a refused Authorization header (apps/core/throttling.py).
    credential_refused = False

    def __init__(self, message: str, *, code: str | None = None, details: Any = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.details = details


class ValidationFailed(ApplicationError):
    status = 400
    code = "invalid"


class NotAuthenticated(ApplicationError):
    status = 401
    code = "authentication_failed"


class PermissionDenied(ApplicationError):
    status = 403
    code = "permission_denied"


class NotFound(ApplicationError):
    status = 404
    code = "not_found"


class Conflict(ApplicationError):
    status = 409
    code = "conflict"


class PolicyViolation(ApplicationError):
    status = 400
    code = "policy_violation"


class Unavailable(ApplicationError):
    """Try again shortly: answered at once with `Retry-After`."""

    status = 503
    code = "unavailable"
    retry_after = 2
