"""manage.py enrollment_token create|list|revoke."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from apps.fleet.models import EnrollmentToken
from tests.fleet.support import enroll_over_http


def run(*args) -> str:
    out = StringIO()
    call_command("enrollment_token", *args, stdout=out, stderr=StringIO())
    return out.getvalue().strip()


def test_create_prints_a_secret_once_that_enrolls_agents(environment):
    secret = run("create", "shop/prod", "--uses", "2", "--expires", "30m")

    token = EnrollmentToken.objects.get()
    assert secret.startswith(f"bwe_{token.key}.")
    assert secret.split(".", 1)[1] not in token.secret_hash
    assert (token.max_uses, token.environment) == (2, environment)
    assert enroll_over_http(secret, "web-1").status_code == 201
    assert enroll_over_http(secret, "web-2").status_code == 201
    assert enroll_over_http(secret, "web-3").status_code == 401


def test_create_prints_the_command_to_run_on_the_host(environment):
    out, err = StringIO(), StringIO()
    call_command("enrollment_token", "create", "shop/prod", "--server",
                 "https://bw.example.com/", stdout=out, stderr=err)

    secret = out.getvalue().strip()
    assert (f"bellwether-agent --server https://bw.example.com --enrollment-token {secret} "
            "--name '<agent-name>' --target-dir '/etc/<service>/bellwether'") in err.getvalue()


def test_list_shows_uses_and_state_but_never_the_secret(environment):
    secret = run("create", "shop/prod")
    listing = run("list", "shop/prod")

    assert "0/1\tactive" in listing
    assert secret.split(".", 1)[1] not in listing


def test_revoke_stops_enrollment(environment):
    secret = run("create", "shop/prod")
    run("revoke", EnrollmentToken.objects.get().key)

    assert enroll_over_http(secret, "web-1").status_code == 401
    assert "revoked" in run("list", "shop/prod")


@pytest.mark.parametrize(("args", "message"), [
    (("create", "shop/nope"), "No environment"),
    (("create", "shop/prod", "--expires", "5y"), "not a duration"),
    (("create", "shop/prod", "--uses", "0"), "between 1 and 100000"),
    (("create", "shop/prod", "--expires", "0s"), "future"),
    (("create", "shop/prod", "--expires", "99999999999d"), "too far"),
    (("revoke", "nokey"), "No enrollment token"),
])
def test_bad_arguments_are_clear_errors(environment, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
