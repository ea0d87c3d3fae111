"""Request parsers that refuse oversized bodies with 413 instead of reading them."""

from django.conf import settings
from rest_framework.parsers import JSONParser

from apps.core.errors import PayloadTooLarge


class LimitedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        request = (parser_context or {}).get("request")
        length = 0
        if request is not None:
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
        if limit is not None and length > limit:
            raise PayloadTooLarge(f"Request body is {length} bytes; the limit is {limit}.")
        return super().parse(stream, media_type, parser_context)
