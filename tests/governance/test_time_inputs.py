"""Hostile times through the API and the admin: a scheduled release's `run_at`
without an offset (400 naming it, never read as UTC), one-off window bounds a DST
change skips (400 naming the field), repeated ones (the first), mixed and
out-of-range moments (4xx, never a 500), and overlaps far ahead (409)."""

from datetime import UTC, datetime, timedelta

import pytest
from django.utils import timezone

from apps.governance import windows
from apps.governance.models import ReleaseWindow, ScheduledRelease
from tests import factories

pytestmark = pytest.mark.django_db

ENV = "/api/v1/environments/shop/prod"


def _error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content[:500]
    body = response.json()["error"]
    assert code is None or body["code"] == code, body
    return body


def _field(body: dict) -> str:
    details = body["details"]
    return details[0]["field"] if isinstance(details, list) else details["field"]


def _in_hours(hours: int) -> datetime:
    return timezone.now() + timedelta(hours=hours)


@pytest.mark.parametrize("run_at", [
    lambda: _in_hours(2).replace(tzinfo=None).isoformat(),  # no offset
    lambda: _in_hours(2).replace(tzinfo=None).isoformat(timespec="minutes"),
    lambda: _in_hours(48).date().isoformat(),  # a date alone
    lambda: _in_hours(2).strftime("%Y-%m-%d %H:%M:%S"),
    lambda: "9999-12-31T23:59:59-14:00",  # past datetime's range in UTC
    lambda: "0001-01-01T00:00:00+14:00",
    lambda: _in_hours(2).isoformat() + "[Europe/Berlin]",
    lambda: "",
])
def test_a_schedule_without_a_utc_offset_or_out_of_range_is_400_naming_run_at(
        activation, deployer, run_at):
    client = factories.api_client_for(deployer)
    body = _error(client.post(f"/api/v1/releases/{activation.pk}/schedule",
                              {"run_at": run_at(), "expected_version": 1}, format="json"), 400)
    assert "run_at" in str(body["details"])
    assert not ScheduledRelease.objects.exists()


@pytest.mark.parametrize("spelling", [
    lambda at: at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
    lambda at: at.astimezone(timezone.get_fixed_timezone(-14 * 60)).isoformat(),
    lambda at: at.astimezone(timezone.get_fixed_timezone(5 * 60 + 45)).isoformat(),
])
def test_a_schedule_with_an_offset_is_the_moment_given(activation, deployer, spelling):
    at = _in_hours(3).replace(microsecond=0)
    response = factories.api_client_for(deployer).post(
        f"/api/v1/releases/{activation.pk}/schedule",
        {"run_at": spelling(at), "expected_version": 1}, format="json")
    assert response.status_code == 201, response.content
    assert ScheduledRelease.objects.get().run_at == at


ONCE = {"kind": "freeze", "name": "once", "timezone": "Europe/Berlin"}


@pytest.mark.parametrize("bounds, field", [
    (("2030-03-31T02:30:00", "2030-03-31T06:00:00"), "starts_at"),
    (("2030-03-31T02:00:00", "2030-03-31T02:59:59"), "starts_at"),
    (("2030-03-30T20:00:00", "2030-03-31T02:15:00"), "ends_at"),
    (("2030-03-30T20:00:00+01:00", "2030-03-31T02:15:00"), "ends_at"),
])
def test_a_one_off_bound_the_clocks_skip_is_400_naming_it(environment, alice, bounds, field):
    body = _error(factories.api_client_for(alice).post(f"{ENV}/windows", {
        **ONCE, "starts_at": bounds[0], "ends_at": bounds[1]}, format="json"), 400,
        "nonexistent_time")
    assert _field(body) == field and "Europe/Berlin" in body["message"]
    assert not ReleaseWindow.objects.exists()


def test_a_one_off_bound_the_clocks_repeat_is_its_first_occurrence(environment, alice):
    response = factories.api_client_for(alice).post(f"{ENV}/windows", {
        **ONCE, "starts_at": "2030-10-27T02:30:00", "ends_at": "2030-10-27T05:00:00"},
        format="json")
    assert response.status_code == 201, response.content
    assert ReleaseWindow.objects.get().starts_at == datetime(2030, 10, 27, 0, 30, tzinfo=UTC)


@pytest.mark.parametrize("bounds", [
    ("2030-03-31T02:30:00+01:00", "2030-03-31T06:00:00+02:00"),  # offsets: exact moments
    ("2030-03-31T00:30:00Z", "2030-03-31T06:00:00"),  # one given, one wall-clock
    ("2030-03-31T01:00:00", "2030-03-31T03:00:00"),  # around the gap, not in it
])
def test_moments_with_offsets_or_around_the_gap_are_accepted(environment, alice, bounds):
    response = factories.api_client_for(alice).post(f"{ENV}/windows", {
        **ONCE, "starts_at": bounds[0], "ends_at": bounds[1]}, format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize("bounds", [
    ("2030-03-31T10:00:00+14:00", "2030-03-31T00:00:00"),  # mixed, ending first
    ("2030-01-01T00:00:00", "2030-01-01T00:00:00Z"),
    ("1999-12-31T23:00:00-14:00", "2000-01-02T00:00:00"),
    ("2999-12-31T23:00:00-14:00", "2999-12-31T23:30:00-14:00"),
    ("9999-12-31T23:59:59", "9999-12-31T23:59:59-14:00"),
    ("2030-01-01T00:00:00", "2031-01-03T00:00:00+00:00"),  # longer than 366 days
])
def test_mixed_or_extreme_moments_are_4xx_never_500(environment, alice, bounds):
    response = factories.api_client_for(alice).post(f"{ENV}/windows", {
        **ONCE, "starts_at": bounds[0], "ends_at": bounds[1]}, format="json")
    assert response.status_code in (201, 400), response.content[:300]


def test_one_off_windows_far_ahead_are_still_checked_for_overlap(environment, alice):
    client = factories.api_client_for(alice)
    ahead = timezone.now().year + 3
    assert client.post(f"{ENV}/windows", {
        "kind": "freeze", "name": "far", "starts_at": f"{ahead}-06-01T00:00:00Z",
        "ends_at": f"{ahead}-08-01T00:00:00Z"}, format="json").status_code == 201
    body = _error(client.post(f"{ENV}/windows", {
        "kind": "freeze", "name": "farther", "starts_at": f"{ahead}-07-31T00:00:00Z",
        "ends_at": f"{ahead + 1}-07-01T00:00:00Z"}, format="json"), 409, "overlapping_window")
    assert body["details"][0]["overlaps"] == "far"
    assert body["details"][0]["from"] == f"{ahead}-07-31T00:00:00+00:00"


def test_a_weekly_window_at_a_time_the_clocks_skip_once_a_year_is_accepted(environment,
                                                                           alice):
    response = factories.api_client_for(alice).post(f"{ENV}/windows", {
        "kind": "freeze", "name": "sunday-night", "timezone": "Europe/Berlin",
        "weekdays": [6], "start_time": "02:30", "end_time": "04:00"}, format="json")
    assert response.status_code == 201, response.content


def _admin_window(client, environment, **fields):
    form = {"environment": environment.pk, "kind": "freeze", "name": "sale",
            "timezone": "Europe/Rome", "weekdays": "[]", **fields}
    return client.post("/admin/governance/releasewindow/add/", form)


def test_the_admin_reads_one_off_times_in_the_windows_timezone(environment, superuser):
    client = factories.session_client(superuser)
    response = _admin_window(client, environment, starts_at_0="2030-01-01",
                             starts_at_1="10:00", ends_at_0="2030-01-01", ends_at_1="12:00")
    assert response.status_code == 302, response.content.decode()[:3000]
    assert ReleaseWindow.objects.get().starts_at == datetime(2030, 1, 1, 9, tzinfo=UTC)


def test_the_admin_refuses_a_one_off_time_the_clocks_skip(environment, superuser):
    client = factories.session_client(superuser)
    response = _admin_window(client, environment, timezone="Europe/Berlin",
                             starts_at_0="2030-03-31", starts_at_1="02:30",
                             ends_at_0="2030-03-31", ends_at_1="05:00")
    assert response.status_code == 200 and "does not exist in Europe/Berlin" in (
        response.content.decode())
    response = _admin_window(client, environment, starts_at_0="2030-03-31", starts_at_1="",
                             ends_at_0="2030-03-31", ends_at_1="05:00")
    assert response.status_code == 200
    assert not ReleaseWindow.objects.exists()


def test_the_service_refuses_the_gap_for_every_caller(environment, superuser):
    with pytest.raises(windows.ValidationFailed) as raised:
        windows.window_create(environment=environment, actor=superuser, kind="allow",
                              name="x", timezone_name="America/New_York",
                              starts_at=datetime(2030, 3, 10, 2, 30),
                              ends_at=datetime(2030, 3, 10, 8))
    assert raised.value.details == {"field": "starts_at"}
