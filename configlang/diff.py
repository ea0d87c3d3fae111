"""Per-file unified diff between two file sets (pure).

Sealed secret placeholders are shown as the reference they stand for
(`${secret:env:NAME}`): their tokens change with every change of a render's
inputs, the secret they resolve to does not.
"""

import difflib

from configlang.secrets import unsealed

CONTEXT_LINES = 3


def _unified(path: str, old: str | None, new: str | None) -> str:
    lines = difflib.unified_diff(
        (old or "").splitlines(keepends=True),
        (new or "").splitlines(keepends=True),
        fromfile=f"a/{path}" if old is not None else "/dev/null",
        tofile=f"b/{path}" if new is not None else "/dev/null",
        n=CONTEXT_LINES,
    )
    out = []
    for line in lines:
        out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
    return "".join(out)


def diff_files(old: list[dict], new: list[dict]) -> list[dict]:
    """[{path, status: added|removed|modified, diff}], unchanged files omitted."""
    before = {f["path"]: unsealed(f["content"]) for f in old}
    after = {f["path"]: unsealed(f["content"]) for f in new}
    changes = []
    for path in sorted(before.keys() | after.keys()):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        status = "added" if a is None else "removed" if b is None else "modified"
        changes.append({"path": path, "status": status, "diff": _unified(path, a, b)})
    return changes
