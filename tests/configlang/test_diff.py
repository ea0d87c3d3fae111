"""Per-file unified diff between two file sets (no DB)."""

import hashlib
import time

import pytest

from configlang.diff import diff_files


def files(contents: dict[str, str]) -> list[dict]:
    """{"a.conf": "x"} -> [{"path": "a.conf", "content": "x"}]"""
    return [{"path": path, "content": content} for path, content in contents.items()]


def test_identical_file_sets_have_no_changes():
    same = files({"a.conf": "a\n", "b.conf": "b\n"})
    assert diff_files(same, same) == []


def test_unchanged_files_are_omitted():
    old = files({"a.conf": "a\n", "b.conf": "b\n"})
    new = files({"a.conf": "a\n", "b.conf": "B\n"})
    changes = diff_files(old, new)
    assert [c["path"] for c in changes] == ["b.conf"]


@pytest.mark.parametrize(
    ("old", "new", "status", "diff"),
    [
        (
            [],
            files({"new.conf": "one\ntwo\n"}),
            "added",
            "--- /dev/null\n+++ b/new.conf\n@@ -0,0 +1,2 @@\n+one\n+two\n",
        ),
        (
            files({"old.conf": "one\ntwo\n"}),
            [],
            "removed",
            "--- a/old.conf\n+++ /dev/null\n@@ -1,2 +0,0 @@\n-one\n-two\n",
        ),
        (
            files({"app.conf": "one\ntwo\n"}),
            files({"app.conf": "one\n2\n"}),
            "modified",
            "--- a/app.conf\n+++ b/app.conf\n@@ -1,2 +1,2 @@\n one\n-two\n+2\n",
        ),
    ],
    ids=["added", "removed", "modified"],
)
def test_each_change_has_a_status_and_a_unified_diff(old, new, status, diff):
    [change] = diff_files(old, new)
    assert change["status"] == status
    assert change["diff"] == diff


def test_hunks_carry_three_lines_of_context():
    old = "".join(f"line {i}\n" for i in range(1, 21))
    new = old.replace("line 10\n", "line ten\n")
    [change] = diff_files(files({"big.conf": old}), files({"big.conf": new}))
    assert change["diff"].splitlines() == [
        "--- a/big.conf",
        "+++ b/big.conf",
        "@@ -7,7 +7,7 @@",
        " line 7",
        " line 8",
        " line 9",
        "-line 10",
        "+line ten",
        " line 11",
        " line 12",
        " line 13",
    ]


def test_changes_further_apart_than_the_context_make_separate_hunks():
    old = "".join(f"line {i}\n" for i in range(1, 31))
    new = old.replace("line 5\n", "five\n").replace("line 25\n", "twenty-five\n")
    [change] = diff_files(files({"big.conf": old}), files({"big.conf": new}))
    hunks = [line for line in change["diff"].splitlines() if line.startswith("@@")]
    assert hunks == ["@@ -2,7 +2,7 @@", "@@ -22,7 +22,7 @@"]


def test_a_missing_trailing_newline_is_marked():
    [change] = diff_files(files({"a.conf": "one\ntwo"}), files({"a.conf": "one\ntwo\n"}))
    assert change["diff"] == (
        "--- a/a.conf\n+++ b/a.conf\n@@ -1,2 +1,2 @@\n one\n-two\n"
        "\\ No newline at end of file\n+two\n"
    )


def test_a_missing_trailing_newline_on_both_sides_is_marked_on_both():
    [change] = diff_files(files({"a.conf": "x\nold"}), files({"a.conf": "x\nnew"}))
    assert change["diff"].endswith(
        "-old\n\\ No newline at end of file\n+new\n\\ No newline at end of file\n"
    )


def test_every_diff_ends_with_a_newline():
    [change] = diff_files([], files({"a.conf": "no newline"}))
    assert change["diff"].endswith("\\ No newline at end of file\n")


def test_changes_are_sorted_by_path():
    old = files({"m.conf": "m\n", "z/last.conf": "z\n", "b.conf": "b\n"})
    new = files({"z/last.conf": "Z\n", "a/first.conf": "a\n", "m.conf": "M\n"})
    changes = diff_files(old, new)
    assert [(c["path"], c["status"]) for c in changes] == [
        ("a/first.conf", "added"),
        ("b.conf", "removed"),
        ("m.conf", "modified"),
        ("z/last.conf", "modified"),
    ]


def test_input_order_does_not_matter():
    old = files({"a.conf": "a\n", "b.conf": "b\n"})
    new = files({"b.conf": "B\n", "a.conf": "A\n"})
    assert diff_files(old, new) == diff_files(list(reversed(old)), list(reversed(new)))


# --- bounded work -------------------------------------------------------------------

def _interleaved(n: int) -> tuple[str, str]:
    """The quadratic shape: every line of the new file is one of the old, each
    behind a new line (difflib's plain matcher takes minutes at 70,000)."""
    return ("".join(f"{i}\n" for i in range(n)),
            "".join(f"y{i}\n{i}\n" for i in range(n)))


HOSTILE_SHAPES = {
    "interleaved 8,000": _interleaved(8000),
    "interleaved 70,000 (about 1 MiB)": _interleaved(70000),
    "repeated lines": ("".join(f"{i % 199}\n" for i in range(40000)),
                       "".join(f"{i % 197}\n" for i in range(40000))),
    "long lines": ("".join(f"{i}{'x' * 500}\n" for i in range(1000)),
                   "".join(f"y{i}{'x' * 500}\n{i}{'x' * 500}\n" for i in range(1000))),
}


@pytest.mark.parametrize(("old", "new"), HOSTILE_SHAPES.values(), ids=HOSTILE_SHAPES.keys())
def test_a_diff_too_costly_to_match_is_shown_as_changed_not_matched_for_minutes(old, new):
    # Bounded work takes about a second on a quiet machine (bench/ measures speed);
    # the unbounded matcher takes minutes. The bound only tells the two apart.
    started = time.monotonic()
    [change] = diff_files(files({"list.txt": old}), files({"list.txt": new}))
    assert time.monotonic() - started < 15
    assert change["too_large"] is True
    assert change["diff"] == ""
    assert (change["old_bytes"], change["new_bytes"]) == (len(old.encode()), len(new.encode()))
    assert change["old_checksum"] == "sha256:" + hashlib.sha256(old.encode()).hexdigest()
    assert change["new_checksum"] == "sha256:" + hashlib.sha256(new.encode()).hexdigest()


def test_the_work_bound_holds_over_all_files_of_a_diff():
    old, new = _interleaved(2000)
    many = 30
    started = time.monotonic()
    changes = diff_files(files({f"f{i}.txt": old for i in range(many)}),
                         files({f"f{i}.txt": new for i in range(many)}))
    assert time.monotonic() - started < 15  # unbounded: minutes
    assert sum(c["too_large"] for c in changes) >= many - 1


def test_a_small_change_in_a_large_file_is_still_shown_line_by_line():
    old = "".join(f"line {i}\n" for i in range(70000))
    new = old.replace("line 35000\n", "line thirty-five thousand\n")
    [change] = diff_files(files({"big.conf": old}), files({"big.conf": new}))
    assert change["too_large"] is False
    assert "-line 35000\n+line thirty-five thousand\n" in change["diff"]


def test_files_after_a_costly_one_still_get_what_is_left_of_the_budget():
    old, new = _interleaved(8000)
    changes = diff_files(files({"a.txt": old, "b.conf": "one\n"}),
                         files({"a.txt": new, "b.conf": "two\n"}))
    assert [(c["path"], c["too_large"]) for c in changes] == \
        [("a.txt", True), ("b.conf", False)]
    assert changes[1]["diff"].endswith("-one\n+two\n")


def test_added_and_removed_files_are_shown_whatever_their_size():
    text = "".join(f"{i}\n" for i in range(70000))
    changes = diff_files(files({"gone.txt": text}), files({"new.txt": text}), work=10)
    assert [(c["status"], c["too_large"]) for c in changes] == \
        [("removed", False), ("added", False)]


def test_the_output_matches_difflib_where_the_budget_allows():
    import difflib
    import random

    rng = random.Random(7)
    for _ in range(300):
        a = "".join(rng.choice(["a\n", "b\n", "c", "\n"]) for _ in range(rng.randint(1, 30)))
        b = "".join(rng.choice(["a\n", "b\n", "c", "\n"]) for _ in range(rng.randint(1, 30)))
        if a == b:
            continue
        expected = "".join(
            line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
            for line in difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                             "a/x", "b/x", n=3))
        [change] = diff_files(files({"x": a}), files({"x": b}))
        assert change["diff"] == expected
