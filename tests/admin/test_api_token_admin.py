"""API tokens in the admin: created with the secret shown once, revoked, never edited."""

import re

from django.contrib.admin.models import LogEntry

from apps.audit.models import AuditEvent
from apps.core.tokens import hash_secret
from apps.tenancy.models import ApiToken
from tests.admin.support import API_TOKENS, change_url, listed, messages_of
from tests.factories import api_token, bearer_client

SECRET = re.compile(r"bwu_[0-9a-f]+\.[A-Za-z0-9_-]+")


def add_token(client, **fields):
    return client.post(f"{API_TOKENS}add/", {
        "name": "ci", "expires_at_0": "", "expires_at_1": "", **fields}, follow=True)


def secrets_in(response) -> list[str]:
    return [found for message in messages_of(response) for found in SECRET.findall(message)]


def authenticates(secret: str) -> bool:
    return bearer_client(secret).get("/api/v1/environments").status_code == 200


def test_adding_a_token_shows_its_secret_once_and_stores_only_its_hash(
        login, superuser, make_user):
    ci = make_user("ci-bot")
    client = login(superuser)

    response = add_token(client, user=str(ci.pk), name="deploys")

    assert response.status_code == 200
    [secret] = secrets_in(response)
    assert secret.startswith("bwu_")
    token = ApiToken.objects.get(user=ci)
    assert token.name == "deploys"
    key, _, plain = secret[len("bwu_"):].partition(".")
    assert token.key == key
    assert token.secret_hash == hash_secret(plain)
    stored = [str(v) for v in ApiToken.objects.filter(pk=token.pk).values().get().values()]
    assert not any(plain in value for value in stored)
    assert authenticates(secret)
    # Shown once: neither the list nor the token's page carries it again.
    assert plain not in client.get(API_TOKENS).content.decode()
    assert plain not in client.get(change_url(API_TOKENS, token.pk)).content.decode()
    assert AuditEvent.objects.filter(action="api_token.create", object_id=str(token.pk)).exists()


def test_staff_user_creates_a_token_for_themselves(login, staff_member):
    user = staff_member("deployer")

    response = add_token(login(user))

    assert response.status_code == 200
    [secret] = secrets_in(response)
    token = ApiToken.objects.get()
    assert token.user == user
    assert authenticates(secret)


def test_revoke_action_sets_revoked_at(login, superuser, make_user):
    token, secret = api_token(make_user("ci-bot"), name="ci", actor=superuser)
    assert authenticates(secret)

    response = login(superuser).post(API_TOKENS, {
        "action": "revoke", "_selected_action": [str(token.pk)]}, follow=True)

    assert response.status_code == 200
    assert messages_of(response) == ["Revoked."]
    token.refresh_from_db()
    assert token.revoked_at is not None
    assert AuditEvent.objects.filter(action="api_token.revoke", object_id=str(token.pk),
                                     actor=superuser).count() == 1
    assert not authenticates(secret)


def test_staff_user_sees_only_their_own_tokens(login, staff_member, make_user, superuser):
    user = staff_member("owner")
    own, _ = api_token(user, name="mine")
    other, _ = api_token(make_user("someone"), name="theirs", actor=superuser)
    client = login(user)

    assert listed(client.get(API_TOKENS)) == [own]
    response = client.get(change_url(API_TOKENS, other.pk))
    assert response.status_code == 302
    assert response["Location"] == "/admin/"


def test_staff_user_cannot_revoke_another_users_token(
        login, staff_member, make_user, superuser):
    other, secret = api_token(make_user("someone"), name="theirs", actor=superuser)

    login(staff_member("owner")).post(API_TOKENS, {
        "action": "revoke", "_selected_action": [str(other.pk)]})

    other.refresh_from_db()
    assert other.revoked_at is None
    assert authenticates(secret)


def test_tokens_cannot_be_edited(login, superuser, make_user):
    token, _ = api_token(make_user("ci-bot"), name="ci", actor=superuser)

    response = login(superuser).post(change_url(API_TOKENS, token.pk), {"name": "renamed"})

    assert response.status_code == 403
    token.refresh_from_db()
    assert token.name == "ci"


def test_admin_history_of_an_added_token_names_the_token(login, superuser, make_user):
    """The "added successfully" message and the admin log read str(token): the key and
    the user, as for tokens made any other way."""
    ci = make_user("ci-bot")

    response = add_token(login(superuser), user=str(ci.pk))

    token = ApiToken.objects.get(user=ci)
    entry = LogEntry.objects.get(object_id=str(token.pk))
    assert entry.object_repr == str(token) == f"{token.key} (ci-bot)"
    assert f"The API token “{token}” was added successfully." in messages_of(response)
