"""A small JSON client for the operator REST API (standard library HTTP: the CLI
needs nothing an HTTP library adds beyond timeouts, which urllib has)."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from urllib.parse import urlencode

from cli.config import Profile
from cli.errors import Refused, Unreachable

USER_AGENT = "bellwether-cli/0.1"
NOT_JSON_SHOWN = 200


class Client:
    """One server and token; every call answers the decoded JSON body or raises
    Refused (the server's error envelope) or Unreachable (no answer)."""

    def __init__(self, profile: Profile):
        self.profile = profile

    def get(self, path: str, **query) -> object:
        return self.call("GET", path, query=query)

    def post(self, path: str, body: object = None, **query) -> object:
        return self.call("POST", path, body=body, query=query)

    def post_raw(self, path: str, data: bytes, content_type: str, **query) -> object:
        return self.call("POST", path, data=data, content_type=content_type, query=query)

    def call(self, method: str, path: str, *, body: object = None, data: bytes | None = None,
             content_type: str = "application/json", query: dict | None = None) -> object:
        if body is not None:
            data = json.dumps(body).encode()
        query = {k: v for k, v in (query or {}).items() if v is not None}
        url = self.profile.url + path + (f"?{urlencode(query)}" if query else "")
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Accept", "application/json")
        request.add_header("User-Agent", USER_AGENT)
        request.add_header("Authorization", f"Bearer {self.profile.token}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        status, raw = self._send(request, method, path)
        decoded = _decoded(raw)
        if status >= 400:
            raise _refusal(status, decoded, raw, method, path)
        return decoded

    def _send(self, request, method: str, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(request, timeout=self.profile.timeout_s) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()
        except TimeoutError:
            raise Unreachable(f"{method} {path}: no answer from {self.profile.url} within "
                              f"{self.profile.timeout_s:g} s") from None
        except ssl.SSLError as exc:
            raise Unreachable(f"{method} {path}: TLS with {self.profile.url} failed: "
                              f"{exc.reason or exc}") from None
        except urllib.error.URLError as exc:
            reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
            raise Unreachable(f"{method} {path}: cannot reach {self.profile.url}: "
                              f"{reason or exc.reason}") from None
        except (ConnectionError, OSError) as exc:
            raise Unreachable(f"{method} {path}: the connection to {self.profile.url} "
                              f"failed: {exc}") from None


def _decoded(raw: bytes) -> object:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


def _refusal(status: int, decoded: object, raw: bytes, method: str, path: str) -> Refused:
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        return Refused(status, error["code"], str(error.get("message", "")),
                       error.get("details"), method=method, path=path)
    text = raw.decode("utf-8", "replace").strip()[:NOT_JSON_SHOWN]
    return Refused(status, f"http_{status}", f"the server answered {status} without its "
                   f"error envelope: {text or '(empty)'}", method=method, path=path)
