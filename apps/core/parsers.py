"""Request parsers: JSON and YAML bodies, bounded in size and depth, holding only
storable text (no NUL, no lone surrogate, in keys or values), so hostile input is
a 4xx (413 or 400) naming the field, never a 500."""

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import BaseParser, JSONParser

from apps.core.text import first_text_problem
from configlang.yamlconfig import load_yaml

# The body a request from nobody known may send: an agent's enrollment (a token, a
# name and 32 labels; the largest valid one, every character escaped, is under
# 62 KiB). Parsing a body costs several times its size in memory, and anyone may
# send one.
ANONYMOUS_BODY_BYTES = 64 * 1024


class BodyOverLimit(RequestDataTooBig):
    def __init__(self, limit: int):
        super().__init__(f"Request body is over {limit} bytes.")
        self.limit = limit


def body_limit_for(user) -> int:
    """The largest body a request of `user` may send: BELLWETHER_MAX_REQUEST_BYTES
    once someone is authenticated, ANONYMOUS_BODY_BYTES before."""
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if user is None or not user.is_authenticated:
        return min(limit, ANONYMOUS_BODY_BYTES)
    return limit


def _read_limited(stream, parser_context) -> bytes:
    """The body, refused (413) past its sender's limit before more is read. DRF parses
    after authenticating, so the sender is known here."""
    request = (parser_context or {}).get("request")
    limit = body_limit_for(getattr(request, "user", None))
    declared = (getattr(request, "META", None) or {}).get("CONTENT_LENGTH") or "0"
    if declared.isdigit() and int(declared) > limit:
        raise BodyOverLimit(limit)
    data = stream.read(limit + 1)
    if len(data) > limit:
        raise BodyOverLimit(limit)
    return data


def _storable(value):
    """The parsed body, or a 400 naming the first key or string that is not text."""
    try:
        found = first_text_problem(value)
    except RecursionError:
        raise ParseError("Body nested too deeply.") from None
    if found:
        field, problem = found
        raise ValidationError({field or "body": [problem]})
    return value


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    """An object whose keys are each given once: a repeated key is refused, never
    silently the last value (YAML bodies refuse duplicates as well)."""
    value = dict(pairs)
    if len(value) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return value


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


MAX_NUMBER_DIGITS = 100


def _bounded_int(text: str) -> int:
    """A JSON integer of at most MAX_NUMBER_DIGITS digits (Python refuses over 4,300
    with a message about its own limits; no field here takes one that long)."""
    if len(text.lstrip("-")) > MAX_NUMBER_DIGITS:
        raise ValueError(f"a number of more than {MAX_NUMBER_DIGITS} digits")
    return int(text)


class BoundedJSONParser(JSONParser):
    """JSON whose nesting cannot exhaust the stack (the json module recurses), without
    NaN or Infinity (not JSON; PostgreSQL refuses them in json columns), and without
    a key given twice in one object (400 naming the key)."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = _read_limited(stream, parser_context)
        try:
            value = json.loads(data.decode("utf-8"), parse_constant=_no_constant,
                               parse_int=_bounded_int, object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            key = exc.key.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
            raise ValidationError({key or "body": ["this key is given more than once"]}) from None
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
        except UnicodeDecodeError:
            raise ParseError("The body is not UTF-8 text (JSON is UTF-8).") from None
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
        return _storable(value)


class YAMLParser(BaseParser):
    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        data = _read_limited(stream, parser_context)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("The body is not UTF-8 text.") from None
        value, problems = load_yaml(text, limits=settings.BELLWETHER_LIMITS, file="body")
        if problems:
            raise ParseError(f"YAML {problems[0]}")
        return _storable(value)


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"
