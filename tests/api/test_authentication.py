"""Who is let in: API tokens (Bearer), Django sessions with CSRF, and every way to fail."""

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.environments.models import Environment
from apps.tenancy.models import ApiToken
from apps.tenancy.services import api_token_revoke
from tests.api.support import ENV, ROUTES
from tests.api_helpers import assert_error, call, call_undone, route_id
from tests.factories import api_token, bearer_client

CSRF_SECRET = "A" * 32  # a valid unmasked CSRF secret: 32 letters or digits


def _anonymous(user):
    return APIClient()


def _malformed(user):
    return bearer_client("not-a-bellwether-token")


def _unknown(user):
    return bearer_client("bwu_0123456789ab.no-such-secret")


def _wrong_secret(user):
    token, _ = api_token(user, name="t")
    return bearer_client(f"bwu_{token.key}.not-the-secret")


def _revoked(user):
    token, secret = api_token(user, name="t")
    api_token_revoke(token=token, actor=user)
    return bearer_client(secret)


def _expired(user):
    token, secret = api_token(user, name="t", expires_at=timezone.now() + timedelta(hours=1))
    ApiToken.objects.filter(pk=token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    return bearer_client(secret)


def _inactive_user(user):
    _, secret = api_token(user, name="t")
    user.is_active = False
    user.save(update_fields=["is_active"])
    return bearer_client(secret)


REFUSED_CLIENTS = {
    "anonymous": (_anonymous, "not_authenticated"),
    "malformed-token": (_malformed, "authentication_failed"),
    "unknown-token": (_unknown, "authentication_failed"),
    "wrong-secret": (_wrong_secret, "authentication_failed"),
    "revoked-token": (_revoked, "authentication_failed"),
    "expired-token": (_expired, "authentication_failed"),
    "inactive-user": (_inactive_user, "authentication_failed"),
}


@pytest.mark.parametrize("who", REFUSED_CLIENTS)
def test_every_route_answers_401_with_bearer_challenge_without_valid_credentials(
    who, route_url, member, subtests
):
    make_client, code = REFUSED_CLIENTS[who]
    client = make_client(member("owner"))

    for route in ROUTES:
        method, path, _, body, _ = route
        with subtests.test(route_id(route)):
            response = call_undone(client, method, route_url(path), body)

            assert_error(response, 401, code)
            assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer ",
        "Bearer bwu_",
        "Bearer bwu_key-without-secret",
        "Bearer bwu_.secret-without-key",
        "Bearer bwu_" + "k" * 17 + ".key-too-long",
        "Bearer bwa_0123456789ab.agent-prefix",
        "Bearer bwu_0123456789ab.secret trailing-garbage",
    ],
)
def test_malformed_bearer_header_is_refused_with_401(header, environment):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get(ENV)

    assert_error(response, 401)
    assert response["WWW-Authenticate"] == "Bearer"


@pytest.mark.parametrize("header", ["Basic cm9vdDpwdy1yb290", "Token abc", "bwu_abc.def"])
def test_other_authorization_schemes_count_as_anonymous(header, environment):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)

    response = client.get(ENV)

    assert_error(response, 401, "not_authenticated")


def test_bearer_scheme_is_case_insensitive(environment, superuser):
    _, secret = api_token(superuser, name="t")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"bearer {secret}")

    response = client.get(ENV)

    assert response.status_code == 200
    assert response.json()["full_name"] == "shop/prod"


def test_valid_token_authenticates_and_records_last_use(environment, member):
    user = member("viewer")
    token, secret = api_token(user, name="ci")

    response = bearer_client(secret).get(ENV)

    assert response.status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_token_of_user_who_was_deactivated_stops_working_at_once(environment, member):
    user = member("owner")
    _, secret = api_token(user, name="ci")
    client = bearer_client(secret)
    assert client.get(ENV).status_code == 200

    user.is_active = False
    user.save(update_fields=["is_active"])

    assert_error(client.get(ENV), 401, "authentication_failed")


def test_revoking_a_token_refuses_its_next_request(environment, member):
    user = member("owner")
    token, secret = api_token(user, name="ci")
    client = bearer_client(secret)
    assert client.get(ENV).status_code == 200

    api_token_revoke(token=token, actor=user)

    error = assert_error(client.get(ENV), 401, "authentication_failed")
    assert "revoked" in error["message"]


def test_session_login_authenticates_safe_requests(environment, member):
    client = APIClient()
    client.force_login(member("viewer"))

    response = client.get("/api/v1/environments")

    assert response.status_code == 200
    assert [e["full_name"] for e in response.json()["results"]] == ["shop/prod"]


def test_session_of_inactive_user_is_anonymous(environment, member):
    user = member("owner")
    client = APIClient()
    client.force_login(user)
    user.is_active = False
    user.save(update_fields=["is_active"])

    assert_error(client.get(ENV), 401, "not_authenticated")


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("patch", ENV, {"poll_interval_s": 60}),
        ("post", f"{ENV}/publish", None),
        ("put", f"{ENV}/templates/extra.conf", {"source": "x\n"}),
        ("delete", f"{ENV}/templates/shop/app.json", None),
        ("post", f"{ENV}/snapshots/1/rollback", None),
    ],
)
def test_session_authenticated_unsafe_request_without_csrf_token_is_refused(
    method, path, body, snapshots, member
):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(member("owner"))
    audit_before = Environment.objects.get(name="prod").audit_events.count()

    response = call(client, method, path, body)

    error = assert_error(response, 403, "permission_denied")
    assert "CSRF" in error["message"]
    assert Environment.objects.get(name="prod").audit_events.count() == audit_before


def test_session_authenticated_unsafe_request_with_csrf_token_is_accepted(environment, member):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(member("owner"))
    client.cookies["csrftoken"] = CSRF_SECRET

    response = client.patch(ENV, {"poll_interval_s": 60}, format="json",
                            HTTP_X_CSRFTOKEN=CSRF_SECRET)

    assert response.status_code == 200
    assert response.json()["poll_interval_s"] == 60


def test_token_authenticated_unsafe_request_needs_no_csrf_token(environment, member):
    user = member("owner")
    _, secret = api_token(user, name="ci")
    client = bearer_client(secret, enforce_csrf_checks=True)

    response = client.patch(ENV, {"poll_interval_s": 60}, format="json")

    assert response.status_code == 200
    assert response.json()["poll_interval_s"] == 60


def test_bad_token_is_refused_even_with_a_valid_session(environment, member):
    client = APIClient()
    client.force_login(member("owner"))
    client.credentials(HTTP_AUTHORIZATION="Bearer bwu_0123456789ab.no-such-secret")

    assert_error(client.get(ENV), 401, "authentication_failed")
