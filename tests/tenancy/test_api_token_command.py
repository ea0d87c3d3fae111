"""manage.py api_token create|list|revoke: the secret is shown once and never stored."""

import hashlib
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.forms.models import model_to_dict

from apps.tenancy.models import ApiToken
from tests.factories import bearer_client


@pytest.fixture
def alice(member, environment):
    return member("viewer", username="alice")


def run(*args) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command("api_token", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def create(username: str, *options) -> str:
    out, _ = run("create", username, *options)
    return out.strip()


def test_create_prints_the_token_once_on_stdout_and_nothing_else(alice):
    out, err = run("create", "alice", "--name=ci")

    token = out.strip()
    assert out == token + "\n"
    assert token.startswith("bwu_")
    row = ApiToken.objects.get(user=alice)
    assert token.startswith(f"bwu_{row.key}.")
    assert row.name == "ci"
    assert token not in err
    assert row.key in err  # stderr says which token was made, without its secret


def test_create_stores_only_the_hash_of_the_secret(alice):
    token = create("alice")

    secret = token.split(".", 1)[1]
    row = ApiToken.objects.get(user=alice)
    assert row.secret_hash == hashlib.sha256(secret.encode()).hexdigest()
    stored = " ".join(str(value) for value in model_to_dict(row).values())
    stored += f" {row.secret_hash} {row.key}"
    assert secret not in stored
    assert token not in stored


def test_each_create_prints_a_different_token(alice):
    assert create("alice") != create("alice")
    assert ApiToken.objects.filter(user=alice).count() == 2


def test_printed_token_authenticates_against_the_api(alice):
    token = create("alice")

    response = bearer_client(token).get("/api/v1/environments")

    assert response.status_code == 200
    assert [e["full_name"] for e in response.json()["results"]] == ["shop/prod"]


def test_token_created_with_expiry_works_until_it_expires(alice):
    token = create("alice", "--expires-days=3")

    row = ApiToken.objects.get(user=alice)
    assert row.expires_at is not None
    assert bearer_client(token).get("/api/v1/environments").status_code == 200


def test_create_for_unknown_user_is_a_command_error_and_creates_nothing(db):
    with pytest.raises(CommandError, match="nobody"):
        run("create", "nobody")

    assert ApiToken.objects.count() == 0


@pytest.mark.parametrize("days", ["0", "-1"])
def test_create_with_expiry_below_one_day_is_a_command_error(days, alice):
    with pytest.raises(CommandError, match="expires-days"):
        run("create", "alice", f"--expires-days={days}")

    assert ApiToken.objects.count() == 0


def test_list_shows_keys_and_states_but_never_secrets(alice, member):
    first = create("alice", "--name=ci")
    second = create(member("owner", username="bob").username)
    ApiToken.objects.filter(key=first.split(".")[0].removeprefix("bwu_")).update(
        revoked_at="2026-01-01T00:00:00Z"
    )

    out, _ = run("list")

    lines = out.splitlines()
    assert len(lines) == 2
    for token in (first, second):
        key, secret = token.removeprefix("bwu_").split(".", 1)
        assert key in out
        assert secret not in out
    assert lines[0].split("\t")[:4] == [first.split(".")[0].removeprefix("bwu_"), "alice",
                                        "ci", "revoked"]
    assert lines[1].split("\t")[1:4] == ["bob", "-", "active"]


def test_list_for_one_user_shows_only_that_users_tokens(alice, member):
    create("alice")
    create(member("owner", username="bob").username)

    out, _ = run("list", "bob")

    assert [line.split("\t")[1] for line in out.splitlines()] == ["bob"]


def test_revoke_makes_the_token_fail_with_401(alice):
    token = create("alice")
    key = token.split(".")[0].removeprefix("bwu_")
    assert bearer_client(token).get("/api/v1/environments").status_code == 200

    out, _ = run("revoke", key)

    assert key in out
    response = bearer_client(token).get("/api/v1/environments")
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "authentication_failed"
    assert response["WWW-Authenticate"] == "Bearer"
    assert ApiToken.objects.get(key=key).revoked_at is not None


def test_revoking_twice_keeps_the_first_revocation_time(alice):
    key = create("alice").split(".")[0].removeprefix("bwu_")
    run("revoke", key)
    revoked_at = ApiToken.objects.get(key=key).revoked_at

    run("revoke", key)

    assert ApiToken.objects.get(key=key).revoked_at == revoked_at


def test_revoke_of_unknown_key_is_a_command_error(db):
    with pytest.raises(CommandError, match="0123456789ab"):
        run("revoke", "0123456789ab")


def test_action_is_required(db):
    with pytest.raises(CommandError):
        run()
