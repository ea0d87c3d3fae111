"""What ends a command other than success, each with its exit code (docs/ci.md)."""

from __future__ import annotations

OK = 0
REFUSED = 1  # the server answered with its error envelope
USAGE = 2  # a bad command line, configuration or local file (argparse's code too)
TIMED_OUT = 3  # --wait / --watch / --timeout passed, or the server paused the rollout
ROLLED_BACK = 4  # the rollout was rolled back
UNREACHABLE = 5  # no answer from the server (refused connection, DNS, TLS, request timeout)


class CliError(Exception):
    """A failure to report on stderr (and as JSON with --output json), then exit."""

    exit_code = REFUSED
    kind = "error"

    def __init__(self, message: str, *, details: list | None = None, body: dict | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or []
        self.body = body  # extra context for --output json (e.g. the final rollout)

    def as_json(self) -> dict:
        body = {"error": {"kind": self.kind, "message": self.message,
                          "details": self.details}, "exit_code": self.exit_code}
        if self.body is not None:
            body.update(self.body)
        return body


class UsageError(CliError):
    exit_code = USAGE
    kind = "usage"


class Unreachable(CliError):
    exit_code = UNREACHABLE
    kind = "unreachable"


class TimedOut(CliError):
    exit_code = TIMED_OUT
    kind = "timed_out"


class RolledBack(CliError):
    exit_code = ROLLED_BACK
    kind = "rolled_back"


class Refused(CliError):
    """The server's error envelope {"error": {code, message, details}} with its status."""

    exit_code = REFUSED
    kind = "refused"

    def __init__(self, status: int, code: str, message: str, details=None, *, method: str = "",
                 path: str = ""):
        super().__init__(message, details=details if isinstance(details, list) else [])
        self.status = status
        self.code = code
        self.method = method
        self.path = path

    def as_json(self) -> dict:
        return {"error": {"kind": self.kind, "status": self.status, "code": self.code,
                          "message": self.message, "details": self.details,
                          "request": f"{self.method} {self.path}".strip()},
                "exit_code": self.exit_code}
