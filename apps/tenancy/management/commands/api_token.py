"""manage.py api_token create|list|revoke: user API tokens for CI and scripts."""

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from apps.tenancy.models import ApiToken
from apps.tenancy.services import api_token_create, api_token_revoke


class Command(BaseCommand):
    help = (
        "Manage per-user API tokens. `create USERNAME` prints the secret once; only "
        "its hash is stored. Send it as `Authorization: Bearer <token>`."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = sub.add_parser("create", help="Create a token for USERNAME and print it once.")
        create.add_argument("username")
        create.add_argument("--name", default="", help="What the token is for, e.g. 'ci'.")
        create.add_argument("--expires-days", type=int, default=None,
                            help="Expire after this many days (default: never).")
        listing = sub.add_parser("list", help="List tokens (keys only, never secrets).")
        listing.add_argument("username", nargs="?")
        revoke = sub.add_parser("revoke", help="Revoke the token with KEY.")
        revoke.add_argument("key")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _create(self, username, name, expires_days, **_):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        if expires_days is not None and expires_days < 1:
            raise CommandError("--expires-days must be at least 1.")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        token, secret = api_token_create(user=user, name=name, expires_at=expires_at,
                                         actor=None)
        self.stderr.write(f"Created token {token.key} for {username}. It is shown only once:")
        self.stdout.write(secret)

    def _list(self, username=None, **_):
        tokens = ApiToken.objects.select_related("user").order_by("user__username", "created_at")
        if username:
            tokens = tokens.filter(user__username=username)
        for token in tokens:
            state = "revoked" if token.revoked_at else "active"
            self.stdout.write(
                f"{token.key}\t{token.user.username}\t{token.name or '-'}\t{state}\t"
                f"expires {token.expires_at or 'never'}"
            )

    def _revoke(self, key, **_):
        token = ApiToken.objects.filter(key=key).first()
        if token is None:
            raise CommandError(f"No token with key {key!r}.")
        api_token_revoke(token=token, actor=None)
        self.stdout.write(f"Revoked {key}.")
