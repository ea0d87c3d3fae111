"""Sign-in throttling (django-axes): after BELLWETHER_LOGIN_FAILURE_LIMIT failed
sign-ins of one username from one address, that pair gets 429 with Retry-After —
on the dashboard's and the admin's sign-in alike, even with the right password —
while the same user from another address, and other users, sign in as usual."""

from unittest import mock

import pytest
from axes.handlers.proxy import AxesProxyHandler
from django.test import Client, override_settings

from apps.core.throttling import LoginAttemptsCacheHandler

pytestmark = pytest.mark.django_db

DASHBOARD_LOGIN = "/login/"
ADMIN_LOGIN = "/admin/login/"
LIMIT = 3


@pytest.fixture(autouse=True)
def _fresh_attempts(empty_cache):
    """With Redis, failed attempts live in the cache: start and end with none."""


@pytest.fixture
def alice(make_user):
    return make_user("alice", is_staff=True)


def _sign_in(path: str, username: str, password: str, address: str = "192.0.2.1"):
    return Client(REMOTE_ADDR=address).post(path, {"username": username,
                                                   "password": password})


def _fail(path: str, username: str, times: int, address: str = "192.0.2.1"):
    for _ in range(times):
        response = _sign_in(path, username, "wrong", address)
        assert response.status_code == 200  # the form again, with its error


def _lock(path: str, username: str, address: str = "192.0.2.1"):
    """Fail until locked out: the LIMIT-th failure is answered 429 already."""
    _fail(path, username, LIMIT - 1, address)
    _locked_out(_sign_in(path, username, "wrong", address))


def _locked_out(response) -> None:
    assert response.status_code == 429, response.status_code
    assert int(response["Retry-After"]) == 900
    assert "Too many sign-in attempts" in response.content.decode()
    assert "_auth_user_id" not in response.wsgi_request.session


@override_settings(AXES_FAILURE_LIMIT=LIMIT)
@pytest.mark.parametrize("path", [DASHBOARD_LOGIN, ADMIN_LOGIN])
def test_repeated_failures_lock_the_username_and_address_out_even_with_the_password(
        alice, path):
    _lock(path, "alice")

    _locked_out(_sign_in(path, "alice", "pw-alice"))


@override_settings(AXES_FAILURE_LIMIT=LIMIT)
def test_a_lockout_on_one_sign_in_page_holds_on_the_other(alice):
    _lock(DASHBOARD_LOGIN, "alice")

    _locked_out(_sign_in(ADMIN_LOGIN, "alice", "pw-alice"))


@override_settings(AXES_FAILURE_LIMIT=LIMIT)
def test_nobody_can_lock_a_user_out_from_another_address(alice, make_user):
    make_user("bob")
    _lock(DASHBOARD_LOGIN, "alice", address="198.51.100.7")

    assert _sign_in(DASHBOARD_LOGIN, "alice", "pw-alice").status_code == 302
    assert _sign_in(DASHBOARD_LOGIN, "bob", "pw-bob", "198.51.100.7").status_code == 302


@override_settings(AXES_FAILURE_LIMIT=LIMIT)
def test_a_success_before_the_limit_forgets_the_failures(alice):
    _fail(DASHBOARD_LOGIN, "alice", LIMIT - 1)
    assert _sign_in(DASHBOARD_LOGIN, "alice", "pw-alice").status_code == 302

    _fail(DASHBOARD_LOGIN, "alice", LIMIT - 1)
    assert _sign_in(DASHBOARD_LOGIN, "alice", "pw-alice").status_code == 302


@override_settings(AXES_FAILURE_LIMIT=LIMIT)
def test_a_forged_x_forwarded_for_does_not_escape_a_lockout(alice):
    _lock(DASHBOARD_LOGIN, "alice")

    response = Client(REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="203.0.113.9").post(
        DASHBOARD_LOGIN, {"username": "alice", "password": "pw-alice"})

    _locked_out(response)


def test_with_the_cache_down_sign_ins_go_through_uncounted(alice):
    """With Redis, attempts are counted in the cache: a cache that is down lets
    sign-ins through (a warning is logged) instead of failing them with a 500."""
    broken = mock.Mock(**{f"{name}.side_effect": ConnectionError("cache down")
                          for name in ("get", "add", "incr", "touch", "delete")})
    with mock.patch("apps.core.throttling.AxesCacheHandler.__init__",
                    lambda handler: setattr(handler, "cache", broken)):
        handler = LoginAttemptsCacheHandler()
    with mock.patch.object(AxesProxyHandler, "implementation", handler), \
            override_settings(AXES_FAILURE_LIMIT=LIMIT):
        wrong = [_sign_in(DASHBOARD_LOGIN, "alice", "wrong") for _ in range(LIMIT + 1)][-1]
        right = _sign_in(DASHBOARD_LOGIN, "alice", "pw-alice")

    assert wrong.status_code == 200
    assert right.status_code == 302
    assert broken.get.called
