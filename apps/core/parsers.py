"""Request parsers: JSON and YAML bodies, bounded in size and depth, so hostile
input is a 4xx (413 or 400), never a 500."""

import json

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser, JSONParser

from configlang.yamlconfig import load_yaml


def _read_limited(stream, parser_context) -> bytes:
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    data = stream.read(limit + 1) if limit is not None else stream.read()
    if limit is not None and len(data) > limit:
        raise RequestDataTooBig("Request body exceeded settings.DATA_UPLOAD_MAX_MEMORY_SIZE.")
    return data


class BoundedJSONParser(JSONParser):
    """JSON whose nesting cannot exhaust the stack (the json module recurses)."""

    def parse(self, stream, media_type=None, parser_context=None):
        data = _read_limited(stream, parser_context)
        try:
            return json.loads(data.decode("utf-8"))
        except RecursionError:
            raise ParseError("JSON nested too deeply.") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None


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
        return value


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"
