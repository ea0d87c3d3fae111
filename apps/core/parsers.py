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


def _read_limited(stream, parser_context) -> bytes:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    data = stream.read(limit + 1) if limit is not None else stream.read()
    if limit is not None and len(data) > limit:
        raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")
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


class BoundedJSONParser(JSONParser):
    """JSON whose nesting cannot exhaust the stack (the json module recurses), without
    NaN or Infinity (not JSON; PostgreSQL refuses them in json columns), and without
    a key given twice in one object (400 naming the key)."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = _read_limited(stream, parser_context)
        try:
            value = json.loads(data.decode("utf-8"), parse_constant=_no_constant,
                               object_pairs_hook=_unique_keys)
        except _DuplicateKey as exc:
            key = exc.key.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
            raise ValidationError({key or "body": ["this key is given more than once"]}) from None
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
        except (ValueError, UnicodeDecodeError) as exc:
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
