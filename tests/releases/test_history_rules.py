"""The pure rules of retention and of the degenerate-render guard."""

from apps.snapshots.rules import confirmation_details, degenerate_render, retention_excess


def files(**contents) -> list[dict]:
    return [{"path": path.replace("_", "/"), "content": text} for path, text in contents.items()]


def test_an_emptied_file_is_degenerate_whatever_the_threshold():
    found = degenerate_render(before=files(a="x" * 10, b="y"), after=files(a="x" * 10, b=""),
                              threshold_percent=0)
    assert found == {"emptied": ["b"], "shrink": None}


def test_a_vanished_file_counts_as_emptied_and_whitespace_as_empty():
    found = degenerate_render(before=files(a="x", b="y"), after=files(a=" \n"),
                              threshold_percent=0)
    assert found["emptied"] == ["a", "b"]


def test_a_file_empty_before_is_not_emptied():
    assert degenerate_render(before=files(a=""), after=files(a=""), threshold_percent=50) is None


def test_a_shrink_at_the_threshold_is_degenerate_and_below_it_is_not():
    before = files(a="x" * 100)
    at = degenerate_render(before=before, after=files(a="x" * 50), threshold_percent=50)
    assert at["shrink"] == {"before_bytes": 100, "after_bytes": 50, "percent": 50,
                            "threshold_percent": 50}
    assert degenerate_render(before=before, after=files(a="x" * 51), threshold_percent=50) is None


def test_threshold_zero_turns_the_shrink_check_off():
    assert degenerate_render(before=files(a="x" * 100), after=files(a="x"),
                             threshold_percent=0) is None


def test_growth_and_no_previous_files_are_fine():
    assert degenerate_render(before=[], after=files(a="x"), threshold_percent=50) is None
    assert degenerate_render(before=files(a="x"), after=files(a="xx"), threshold_percent=1) is None


def test_details_name_each_emptied_file_and_the_shrink():
    details = confirmation_details({"emptied": ["a"], "shrink": {"percent": 90}})
    assert details == [{"file": "a", "change": "emptied"}, {"change": "shrink", "percent": 90}]


def test_retention_removes_the_oldest_unkept_until_within_both_bounds():
    stored = [(1, 10), (2, 10), (3, 10), (4, 10), (5, 10)]
    assert retention_excess(stored=stored, kept=set(), max_count=3, max_bytes=1000) == [1, 2]
    assert retention_excess(stored=stored, kept={1}, max_count=3, max_bytes=1000) == [2, 3]
    assert retention_excess(stored=stored, kept=set(), max_count=10, max_bytes=25) == [1, 2, 3]


def test_retention_never_removes_kept_ones_even_when_over_bounds():
    stored = [(1, 10), (2, 10)]
    assert retention_excess(stored=stored, kept={1, 2}, max_count=1, max_bytes=1) == []


def test_retention_within_bounds_removes_nothing():
    assert retention_excess(stored=[(1, 10)], kept=set(), max_count=1, max_bytes=10) == []
