"""Per-file unified diff between two file sets (pure), bounded in work.

Sealed secret placeholders are shown as the reference they stand for
(`${secret:env:NAME}`): their tokens change with every change of a render's
inputs, the secret they resolve to does not.

Line matching (difflib's) costs up to the product of the two files' line
counts, more with repeated lines. Every call of `diff_files` draws on one
budget of matching work (`DIFF_WORK`), charged before each matching step: a
file whose matching would go over what is left is shown as changed, with its
sizes and checksums, not line by line. The rest of the work (reading the
lines, writing the hunks) is linear in the files' sizes.
"""

import difflib
import hashlib

from configlang.secrets import unsealed

CONTEXT_LINES = 3
# At most about 0.4 s of matching in all, whatever the files (about 400 ns a
# unit at worst, measured; docs/security.md).
DIFF_WORK = 1_000_000


class _TooCostly(Exception):
    pass


class DiffBudget:
    """The matching work one diff may still do, in lines visited."""

    def __init__(self, work: int = DIFF_WORK):
        self.left = work

    def charge(self, work: int) -> None:
        if work > self.left:
            raise _TooCostly
        self.left -= work


class _BoundedMatcher(difflib.SequenceMatcher):
    """difflib's matcher, charging each longest-match search before it runs: its
    cost is the lines of `a` in range and every position in `b` each of them
    occurs at (difflib walks that list)."""

    def __init__(self, a: list[str], b: list[str], budget: DiffBudget):
        self.budget = budget
        super().__init__(None, a, b)

    def find_longest_match(self, alo=0, ahi=None, blo=0, bhi=None):
        ahi = len(self.a) if ahi is None else ahi
        bhi = len(self.b) if bhi is None else bhi
        if ahi <= alo or bhi <= blo:  # nothing to match (an added or removed file)
            return difflib.Match(alo, blo, 0)
        b2j = self.b2j
        self.budget.charge(1 + max(0, ahi - alo) + sum(len(b2j.get(line, ()))
                                                   for line in self.a[alo:ahi]))
        return super().find_longest_match(alo, ahi, blo, bhi)


def _range(start: int, stop: int) -> str:
    """A hunk's range as unified diff writes it (difflib's own convention)."""
    beginning, length = start + 1, stop - start
    if length == 1:
        return f"{beginning}"
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def _marked(line: str) -> str:
    return line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"


def _unified(path: str, old: str | None, new: str | None, budget: DiffBudget) -> str:
    a = (old or "").splitlines(keepends=True)
    b = (new or "").splitlines(keepends=True)
    out = [f"--- {f'a/{path}' if old is not None else '/dev/null'}\n",
           f"+++ {f'b/{path}' if new is not None else '/dev/null'}\n"]
    for group in _BoundedMatcher(a, b, budget).get_grouped_opcodes(CONTEXT_LINES):
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.extend(_marked(" " + line) for line in a[i1:i2])
                continue
            if tag in ("replace", "delete"):
                out.extend(_marked("-" + line) for line in a[i1:i2])
            if tag in ("replace", "insert"):
                out.extend(_marked("+" + line) for line in b[j1:j2])
    return "".join(out) if len(out) > 2 else ""


def _summary(text: str | None) -> tuple[int | None, str | None]:
    if text is None:
        return None, None
    data = text.encode()
    return len(data), "sha256:" + hashlib.sha256(data).hexdigest()


def file_change(path: str, old: str | None, new: str | None, budget: DiffBudget) -> dict:
    """{path, status, diff, too_large}; a file too costly to match line by line
    has an empty diff and old/new sizes (bytes) and checksums instead."""
    status = "added" if old is None else "removed" if new is None else "modified"
    try:
        return {"path": path, "status": status, "diff": _unified(path, old, new, budget),
                "too_large": False}
    except _TooCostly:
        (old_bytes, old_checksum), (new_bytes, new_checksum) = _summary(old), _summary(new)
        return {"path": path, "status": status, "diff": "", "too_large": True,
                "old_bytes": old_bytes, "new_bytes": new_bytes,
                "old_checksum": old_checksum, "new_checksum": new_checksum}


def diff_files(old: list[dict], new: list[dict], *, work: int = DIFF_WORK) -> list[dict]:
    """[{path, status: added|removed|modified, diff, too_large}], unchanged files
    omitted; all files together do at most `work` matching work."""
    before = {f["path"]: unsealed(f["content"]) for f in old}
    after = {f["path"]: unsealed(f["content"]) for f in new}
    budget = DiffBudget(work)
    changes = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a != b:
            changes.append(file_change(path, a, b, budget))
    return changes
