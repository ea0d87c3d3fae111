"""DRF authentication by user API token: `Authorization: Bearer bwu_<key>.<secret>`."""

from datetime import timedelta

from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions

from apps.core import tokens
from apps.tenancy.models import ApiToken

USER_TOKEN_PREFIX = "bwu"
# last_used_at is informational; refreshing it at most this often keeps
# authenticated requests free of a write each.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != self.keyword.lower():
            return None
        parsed = tokens.parse(presented.strip(), USER_TOKEN_PREFIX)
        if parsed is None:
            raise exceptions.AuthenticationFailed("Malformed or unknown API token.")
        key, secret = parsed
        token = ApiToken.objects.select_related("user").filter(key=key).first()
        if token is None or not tokens.secret_matches(secret, token.secret_hash):
            raise exceptions.AuthenticationFailed("Malformed or unknown API token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This API token has been revoked.")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("This API token has expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("This user is inactive.")
        if token.last_used_at is None or now - token.last_used_at > LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request):
        return self.keyword


class ApiTokenScheme(OpenApiAuthenticationExtension):
    """Describes the token for the OpenAPI schema (registered by being defined)."""

    target_class = ApiTokenAuthentication
    name = "apiToken"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "bwu_<key>.<secret>"}
