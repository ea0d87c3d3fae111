"""A YAML request parser for descriptors: safe_load only, bounded like configs."""

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import BaseParser

from apps.snapshots.yamlconfig import load_yaml


class YAMLParser(BaseParser):
    media_type = "application/yaml"

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            text = stream.read().decode("utf-8")
        except UnicodeDecodeError:
            raise ParseError("The body is not UTF-8 text.") from None
        value, problems = load_yaml(text, limits=settings.BELLWETHER_LIMITS, file="body")
        if problems:
            raise ParseError(f"YAML {problems[0]}")
        return value


class TextYAMLParser(YAMLParser):
    media_type = "text/yaml"
