"""Builds the CLI tests' server database (run as a script in the server's
environment, embedded mode): migrate, the demo (shop/staging direct, shop/prod
staged with #2 waiting for a rollout), API tokens for the demo's deployer and a
viewer, and enrollment tokens. Prints the secrets as one JSON line."""

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "project.settings")

import django  # noqa: E402

django.setup()

from django.contrib.auth import get_user_model  # noqa: E402
from django.core.management import call_command  # noqa: E402

from apps.environments.models import Environment  # noqa: E402
from apps.tenancy.models import Role, Tenant  # noqa: E402
from tests import factories  # noqa: E402


def main() -> None:
    call_command("migrate", verbosity=0, interactive=False)
    with open(os.devnull, "w") as quiet:
        call_command("load_demo", stdout=quiet)
    users = get_user_model().objects
    admin, dev = users.get(username="admin"), users.get(username="dev")
    viewer = factories.member(Tenant.objects.get(slug="shop-team"), Role.VIEWER,
                              username="viewer", actor=admin)
    environments = {e.name: e for e in Environment.objects.filter(application__name="shop")}
    secrets = {
        "deployer": factories.api_token(dev, name="cli-tests")[1],
        "viewer": factories.api_token(viewer, name="cli-tests")[1],
        # Valid for as long as a whole test session may run.
        "enroll_prod": factories.enrollment_token(environments["prod"], uses=50, actor=admin,
                                                  expires_in=timedelta(days=2))[1],
    }
    print(json.dumps(secrets))


if __name__ == "__main__":
    main()
