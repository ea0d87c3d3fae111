"""Times in their zones, pure: wall-clock times a DST change skips (none) or repeats
(the first), weekly windows across both changes (RFC 5545), and overlap checks
exact for windows of any length or distance, in bounded work."""

from datetime import UTC, date, datetime, time, timedelta

import pytest

from apps.governance import rules
from apps.governance.rules import Window

BERLIN = "Europe/Berlin"


@pytest.mark.parametrize("tz, wall", [
    ("Europe/Berlin", datetime(2025, 3, 30, 2, 30)),
    ("Europe/Berlin", datetime(2025, 3, 30, 2, 0)),
    ("Europe/Berlin", datetime(2025, 3, 30, 2, 59, 59, 999999)),
    ("America/New_York", datetime(2025, 3, 9, 2, 30)),
    ("Australia/Lord_Howe", datetime(2025, 10, 5, 2, 15)),  # a half-hour change
    ("Pacific/Apia", datetime(2011, 12, 30, 12, 0)),  # a whole day skipped
    ("America/Sao_Paulo", datetime(2018, 11, 4, 0, 30)),  # midnight skipped
])
def test_a_wall_clock_time_a_dst_change_skips_names_no_moment(tz, wall):
    assert rules.local_moment(wall, rules.zone(tz)) is None


@pytest.mark.parametrize("tz, wall, moment", [
    ("Europe/Berlin", datetime(2025, 10, 26, 2, 30), datetime(2025, 10, 26, 0, 30, tzinfo=UTC)),
    ("America/New_York", datetime(2025, 11, 2, 1, 30),
     datetime(2025, 11, 2, 5, 30, tzinfo=UTC)),
    ("Europe/Berlin", datetime(2025, 3, 30, 3, 0), datetime(2025, 3, 30, 1, 0, tzinfo=UTC)),
    ("Europe/Berlin", datetime(2025, 3, 30, 1, 59), datetime(2025, 3, 30, 0, 59, tzinfo=UTC)),
    ("UTC", datetime(2025, 3, 30, 2, 30), datetime(2025, 3, 30, 2, 30, tzinfo=UTC)),
])
def test_a_repeated_time_is_its_first_occurrence_and_others_are_exact(tz, wall, moment):
    assert rules.local_moment(wall, rules.zone(tz)) == moment
    assert rules.local_moment(wall.replace(fold=1), rules.zone(tz)) == moment


def _sunday(start: time, end: time, name="w", tz=BERLIN) -> Window:
    return Window(name=name, kind="freeze", timezone=tz, weekdays=(6,), start_time=start,
                  end_time=end)


def _on(window: Window, day: date) -> list[tuple]:
    start = datetime.combine(day, time(0), tzinfo=UTC) - timedelta(hours=3)
    return [s for s in rules.occurrences(window, start, start + timedelta(hours=30))
            if s[0].date() == day or s[1].date() == day]


def test_a_weekly_start_in_the_gap_opens_an_hour_later_that_night_only():
    window = _sunday(time(2, 30), time(4))
    assert _on(window, date(2025, 3, 30)) == [  # 03:30 to 04:00 summer time
        (datetime(2025, 3, 30, 1, 30, tzinfo=UTC), datetime(2025, 3, 30, 2, 0, tzinfo=UTC))]
    assert _on(window, date(2025, 4, 6)) == [  # 02:30 to 04:00 summer time
        (datetime(2025, 4, 6, 0, 30, tzinfo=UTC), datetime(2025, 4, 6, 2, 0, tzinfo=UTC))]


def test_a_weekly_window_inside_the_gap_is_absent_that_night_and_no_span_is_inverted():
    assert _on(_sunday(time(2), time(3)), date(2025, 3, 30)) == []
    assert _on(_sunday(time(2, 30), time(3)), date(2025, 3, 30)) == []
    assert len(_on(_sunday(time(2), time(3)), date(2025, 4, 6))) == 1
    for start, end in rules.occurrences(_sunday(time(2, 30), time(3)),
                                        datetime(2025, 1, 1, tzinfo=UTC),
                                        datetime(2026, 1, 1, tzinfo=UTC)):
        assert start < end


def test_a_weekly_window_over_the_repeated_hour_covers_it_twice():
    spans = _on(_sunday(time(2), time(3)), date(2025, 10, 26))
    assert spans == [(datetime(2025, 10, 26, 0, 0, tzinfo=UTC),
                      datetime(2025, 10, 26, 2, 0, tzinfo=UTC))]
    window = _sunday(time(2), time(3))
    for at in (datetime(2025, 10, 26, 0, 30, tzinfo=UTC), datetime(2025, 10, 26, 1, 30,
                                                                   tzinfo=UTC)):
        assert rules.window_open_at(window, at)  # 02:30 summer and 02:30 winter time


def test_the_overlap_check_and_the_open_check_agree_across_a_gap():
    """On the spring-forward night 01:00-02:30 ends at 03:30 summer time, so it meets
    03:00-04:00: both are open at 03:15 and the overlap check says so."""
    early, late = _sunday(time(1), time(2, 30), "early"), _sunday(time(3), time(4), "late")
    at = datetime(2025, 3, 30, 1, 15, tzinfo=UTC)  # 03:15 summer time
    assert rules.window_open_at(early, at) and rules.window_open_at(late, at)
    span = rules.windows_overlap(early, late, datetime(2025, 1, 1, tzinfo=UTC))
    assert span == (datetime(2025, 3, 30, 1, 0, tzinfo=UTC),
                    datetime(2025, 3, 30, 1, 30, tzinfo=UTC))


def _once(start: datetime, days: float, name="o") -> Window:
    return Window(name=name, kind="freeze", timezone="UTC", starts_at=start,
                  ends_at=start + timedelta(days=days))


NOW = datetime(2025, 1, 1, tzinfo=UTC)


@pytest.mark.parametrize("ahead_days", [0, 200, 371, 372, 800, 2000, 365 * 900])
def test_one_off_windows_overlap_however_far_ahead_they_lie(ahead_days):
    start = NOW + timedelta(days=ahead_days)
    a, b = _once(start, 10, "a"), _once(start + timedelta(days=5), 10, "b")
    assert rules.windows_overlap(a, b, NOW) == (start + timedelta(days=5),
                                                start + timedelta(days=10))
    apart = _once(start + timedelta(days=10), 3, "c")  # starts as a ends: no overlap
    assert rules.windows_overlap(a, apart, NOW) is None


def test_one_off_windows_overlap_past_a_year_from_now_even_when_longer_than_one():
    a = _once(NOW + timedelta(days=100), 366, "a")
    b = _once(NOW + timedelta(days=460), 30, "b")  # meets a only past now + 371 days
    assert rules.windows_overlap(a, b, NOW) == (NOW + timedelta(days=460),
                                                NOW + timedelta(days=466))
    long = Window(name="l", kind="freeze", timezone="UTC", starts_at=NOW,
                  ends_at=NOW + timedelta(days=3000))  # longer than any allowed: still exact
    assert rules.windows_overlap(long, _once(NOW + timedelta(days=2900), 1), NOW)


def test_a_one_off_and_a_weekly_window_are_decided_in_bounded_work(monkeypatch):
    calls = []
    real = rules._local
    monkeypatch.setattr(rules, "_local", lambda *a: calls.append(a) or real(*a))
    friday = Window(name="f", kind="freeze", timezone=BERLIN, weekdays=(4,),
                    start_time=time(15), end_time=time(16))
    far = _once(datetime(2900, 1, 1, tzinfo=UTC), 366)
    span = rules.windows_overlap(far, friday, NOW)
    assert span[0].astimezone(rules.zone(BERLIN)).weekday() == 4
    assert span[0] - far.starts_at < timedelta(days=8)
    assert len(calls) <= 8  # a week of days, not a year of them


def test_two_weekly_windows_that_never_meet_are_decided_within_a_year_of_spans():
    a = _sunday(time(1), time(2), "a")
    b = _sunday(time(5), time(6), "b")
    assert rules.windows_overlap(a, b, NOW) is None


def test_weekly_windows_in_two_zones_meet_only_while_their_dst_differs():
    # 18:00-19:00 in New York and 23:30-00:30 in London meet only in the weeks
    # when one zone has changed its clocks and the other not (March and Nov).
    ny = Window(name="ny", kind="freeze", timezone="America/New_York", weekdays=(2,),
                start_time=time(18), end_time=time(19))
    ldn = Window(name="ldn", kind="freeze", timezone="Europe/London", weekdays=(2,),
                 start_time=time(22, 30), end_time=time(23))
    span = rules.windows_overlap(ny, ldn, NOW)
    assert span is not None and span[0].month == 3


def test_a_hold_shows_until_in_the_windows_own_timezone():
    window = _sunday(time(2), time(3))
    hold = rules.release_hold(freezes=[window], allows=[],
                              at=datetime(2025, 10, 26, 1, 30, tzinfo=UTC), overridden=False)
    assert hold["until"] == "2025-10-26T03:00:00+01:00"
