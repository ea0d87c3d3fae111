"""Per-file unified diff between two file sets (no DB)."""

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
