"""manage.py enrollment_token create APP/ENV: a token agents enroll with."""

import re
from datetime import timedelta

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from apps.core.errors import ApplicationError
from apps.environments.models import Environment
from apps.fleet.enrollment import enrollment_token_create, enrollment_token_revoke
from apps.fleet.models import EnrollmentToken
from apps.fleet.rules import enroll_command

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    match = _DURATION.match(text.strip())
    if not match:
        raise CommandError(f"--expires: {text!r} is not a duration like 30m, 24h or 7d.")
    return timedelta(**{_UNITS[match[2]]: int(match[1])})


class Command(BaseCommand):
    help = (
        "Manage enrollment tokens. `create APP/ENV` prints the secret once (only its "
        "hash is stored); an agent exchanges it for its own token at "
        "POST /api/v1/agent/enroll."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
        create = sub.add_parser("create", help="Create a token for APP/ENV and print it once.")
        create.add_argument("environment", metavar="APP/ENV", help="e.g. shop/prod")
        create.add_argument("--uses", type=int, default=1,
                            help="How many agents may enroll with it (default 1).")
        create.add_argument("--expires", default="24h",
                            help="Lifetime: a number with s, m, h or d (default 24h).")
        create.add_argument("--name", default="", help="What the token is for.")
        create.add_argument("--server", default="",
                            help="This server's URL as agents reach it, for the command "
                                 "printed with the token.")
        listing = sub.add_parser("list", help="List tokens of APP/ENV (never the secrets).")
        listing.add_argument("environment", metavar="APP/ENV")
        revoke = sub.add_parser("revoke", help="Revoke the token with KEY.")
        revoke.add_argument("key")

    def handle(self, *args, action, **options):
        getattr(self, f"_{action}")(**options)

    def _environment(self, full_name: str) -> Environment:
        application, _, name = full_name.partition("/")
        environment = (Environment.objects.select_related("application__tenant")
                       .filter(application__name=application, name=name).first())
        if environment is None:
            raise CommandError(f"No environment {full_name!r} (expected APP/ENV).")
        return environment

    def _create(self, environment, uses, expires, name, server="", **_):
        if not 1 <= uses <= 100_000:
            raise CommandError("--uses must be between 1 and 100000.")
        env = self._environment(environment)
        try:
            expires_at = timezone.now() + parse_duration(expires)
            token, secret = enrollment_token_create(
                environment=env, max_uses=uses, name=name, actor=None, expires_at=expires_at)
        except OverflowError:
            raise CommandError(f"--expires: {expires!r} is too far in the future.") from None
        except ApplicationError as exc:
            raise CommandError(f"--expires: {exc.message}") from None
        self.stderr.write(f"Enrollment token {token.key} for {env.full_name}: {uses} use(s), "
                          f"expires {token.expires_at:%Y-%m-%d %H:%M}Z. Shown only once:")
        self.stdout.write(secret)
        command = enroll_command(server=server or "https://<this-server>",
                                 enrollment_token=secret)
        self.stderr.write(f"On the host, run (fill in the <placeholders>): {command}")

    def _list(self, environment, **_):
        now = timezone.now()
        for token in EnrollmentToken.objects.filter(environment=self._environment(environment)):
            state = ("revoked" if token.revoked_at else "expired" if token.expires_at <= now
                     else "used up" if token.uses >= token.max_uses else "active")
            self.stdout.write(f"{token.key}\t{token.uses}/{token.max_uses}\t{state}\t"
                              f"expires {token.expires_at:%Y-%m-%d %H:%M}Z\t{token.name or '-'}")

    def _revoke(self, key, **_):
        token = EnrollmentToken.objects.filter(key=key).first()
        if token is None:
            raise CommandError(f"No enrollment token with key {key!r}.")
        enrollment_token_revoke(token=token, actor=None)
        self.stdout.write(f"Revoked {key}.")
