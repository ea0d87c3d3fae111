"""Drift: managed files changed on this host since the agent wrote them (a hand edit).

After each successful apply the applier records in the state the sha256 and mode
of every file it wrote (`written`: hashes only, of files holding a resolved secret
too) and which files received a secret (`secret_files`), and keeps the bundle as
the server sent it in the state directory (`applied-bundle.json`: sealed
placeholders, never a resolved secret). Each cycle `Watch.check` compares the
files on disk with that record: changed content is `modified` (summarised as
"+3 -1 lines" against the snapshot's content, counted once per content with a
bounded amount of work; a file that received a secret only
as "content changed"), a file gone is `missing`, another mode is `mode`. It reports
the drifted set to the server when the set changes, and once after a start.

Under the environment's `restore` drift policy it applies the snapshot's files
again through the applier (backup, validate, swap, reload) and reports the drift
as restored; a restore that fails is reported (restored false), logged, and not
tried again for the same drifted set of the same snapshot until that set changes
(or clears), another snapshot is applied or the agent restarts. Nothing is checked
while an apply is in progress or a snapshot is blocked.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat

from agent import files as fs
from agent.client import ProtocolError, Unauthorized

logger = logging.getLogger("agent.drift")

MODIFIED, MISSING, MODE = "modified", "missing", "mode"
REPORT, RESTORE = "report", "restore"
BUNDLE_FILE = "applied-bundle.json"
# Larger files are not diffed line by line: their summary says so.
MAX_DIFF_BYTES = 1 << 20
MAX_DIFF_LINES = 20_000
# Steps of the line comparison (diagonals tried + lines matched): about a second.
MAX_DIFF_WORK = 2_000_000
MAX_SUMMARY = 200
SECRET_SUMMARY = "content changed"
# The record of a managed path that was not a readable regular file after the apply.
UNRECORDED = {"sha256": "", "mode": -1}


def _read(path: str) -> tuple[bytes, int] | None:
    """(content, mode) of the regular file at `path`, never following a symlink;
    None when there is no such file."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if not stat.S_ISREG(info.st_mode):
        return b"", -1  # a directory, a symlink...: not the file written
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as handle:
        return handle.read(), stat.S_IMODE(info.st_mode)


def written(target_dir: str, paths) -> dict:
    """{path: {"sha256", "mode"}} of the files as they are now (just written). A
    path that is not a regular file that reads is recorded as UNRECORDED: it is
    reported as drift until an apply writes it again."""
    record = {}
    for relative in sorted(paths):
        try:
            found = _read(fs.inside(target_dir, relative))
        except (OSError, ValueError) as exc:
            found = None
            logger.warning("cannot record %s for drift checks: %s", relative, exc)
        if found is None or found[1] < 0:
            record[relative] = dict(UNRECORDED)
        else:
            record[relative] = {"sha256": hashlib.sha256(found[0]).hexdigest(),
                                "mode": found[1]}
    return record


def _edit_distance(old: list, new: list, budget: int) -> int | None:
    """Lines removed + added by the shortest edit from `old` to `new` (Myers'
    greedy algorithm), or None once more than `budget` steps would be needed."""
    n, m = len(old), len(new)
    furthest = [0] * (2 * (n + m) + 3)  # by diagonal k = x - y, offset by n + m + 1
    offset, work = n + m + 1, 0
    for distance in range(n + m + 1):
        for k in range(-distance, distance + 1, 2):
            if k == -distance or (k != distance and furthest[offset + k - 1]
                                  < furthest[offset + k + 1]):
                x = furthest[offset + k + 1]
            else:
                x = furthest[offset + k - 1] + 1
            y, start = x - k, x
            while x < n and y < m and old[x] == new[y]:
                x, y = x + 1, y + 1
            work += 1 + x - start
            furthest[offset + k] = x
            if x >= n and y >= m:
                return distance
        if work > budget:
            return None
    return n + m


def diff_summary(expected: str | None, actual: bytes) -> str:
    """"+3 -1 lines": how `actual` differs from the snapshot's `expected` content,
    in line counts only (never the lines themselves). The work is bounded: past
    MAX_DIFF_WORK steps the summary gives the line counts of both versions."""
    if expected is None:
        return "content changed"
    if max(len(actual), len(expected)) > MAX_DIFF_BYTES:
        return "content changed (too large to compare)"
    try:
        text = actual.decode("utf-8")
    except UnicodeDecodeError:
        return "content changed (not UTF-8 text)"
    old, new = expected.splitlines(keepends=True), text.splitlines(keepends=True)
    if max(len(old), len(new)) > MAX_DIFF_LINES:
        return "content changed (too large to compare)"
    same = 0  # the lines both start and end with are not compared again
    while same < min(len(old), len(new)) and old[same] == new[same]:
        same += 1
    tail = 0
    while tail < min(len(old), len(new)) - same and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    distance = _edit_distance(old[same:len(old) - tail], new[same:len(new) - tail],
                              MAX_DIFF_WORK)
    if distance is None:
        return f"content changed ({len(new)} lines, was {len(old)})"
    added = (distance + len(new) - len(old)) // 2
    return f"+{added} -{distance - added} lines"


def _file_drift(path: str, relative: str, record: dict, *, secret: bool,
                expected: str | None, summaries: dict) -> dict | None:
    try:
        found = _read(path)
    except OSError as exc:
        return {"path": relative, "change": MODIFIED, "summary": f"cannot be read ({exc.strerror})"}
    if found is None:
        return {"path": relative, "change": MISSING, "summary": "file removed"}
    content, mode = found
    if mode < 0:
        return {"path": relative, "change": MODIFIED, "summary": "no longer a regular file"}
    if record["sha256"] == UNRECORDED["sha256"]:
        return {"path": relative, "change": MODIFIED,
                "summary": "not as the apply left it (it could not be recorded)"}
    digest = hashlib.sha256(content).hexdigest()
    if digest != record["sha256"]:
        key = (record["sha256"], digest, secret or expected is None)
        if summaries.get(relative, (None,))[0] != key:
            summaries[relative] = (key, SECRET_SUMMARY if secret
                                   else diff_summary(expected, content))
        summary = summaries[relative][1]
        if mode != record["mode"]:
            summary += f", mode {record['mode']:04o} -> {mode:04o}"
        return {"path": relative, "change": MODIFIED, "summary": summary[:MAX_SUMMARY]}
    if mode != record["mode"]:
        return {"path": relative, "change": MODE,
                "summary": f"mode {record['mode']:04o} -> {mode:04o}"}
    return None


def drifted(target_dir: str, record: dict, *, secret_files=(), expected=None,
            summaries: dict | None = None) -> list:
    """[{path, change, summary}] of the recorded files that are no longer as written,
    by path. `expected` {path: content} is the applied snapshot's files (for diffs).
    `summaries` keeps the line counts of the drifted contents between checks (by
    path, with the hashes they were computed for), so a file that stays drifted
    costs a hash, not a diff; it is left holding the drifted paths' only."""
    secret_files, expected = set(secret_files), expected or {}
    summaries = {} if summaries is None else summaries
    found = []
    for relative in sorted(record):
        try:
            path = fs.inside(target_dir, relative)
        except fs.LinkLeaves:  # never read, but reported
            found.append({"path": relative, "change": MODIFIED,
                          "summary": "replaced by a link leaving the target"})
            continue
        except ValueError:
            continue  # recorded by an older agent? never read outside the target
        change = _file_drift(path, relative, record[relative],
                             secret=relative in secret_files,
                             expected=None if relative in secret_files
                             else expected.get(relative), summaries=summaries)
        if change is not None:
            found.append(change)
    for relative in set(summaries) - {f["path"] for f in found}:
        del summaries[relative]
    return found


def bundle_path(state_dir: str) -> str:
    return os.path.join(state_dir, BUNDLE_FILE)


def keep_bundle(state_dir: str, bundle: dict) -> None:
    """Keep the applied bundle as the server sent it (sealed placeholders only)."""
    fs.write_atomic(bundle_path(state_dir), json.dumps(bundle).encode("utf-8"), mode=0o600,
                    directory_mode=fs.PRIVATE_DIRECTORY_MODE)


def kept_bundle(state_dir: str, number: int, checksum: str) -> dict | None:
    """The kept bundle when it is the one of (number, checksum), else None."""
    try:
        with open(bundle_path(state_dir), "rb") as handle:
            bundle = json.loads(handle.read().decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    if not isinstance(bundle, dict) or (bundle.get("number"), bundle.get("checksum")) != (
            number, checksum):
        return None
    return bundle


def _keys(files: list) -> list:
    return [(f["path"], f["change"]) for f in files]


class Watch:
    """Checks the managed files each cycle, reports drift, restores under `restore`."""

    def __init__(self, *, client, applier, persist):
        self.client = client
        self.applier = applier
        self.persist = persist
        self.reported_since_start = False
        # (snapshot number, checksum, drifted set) whose restore failed: not retried.
        self.restore_failed_for: tuple | None = None
        self.skip_logged = False
        self.pending: tuple | None = None  # a report the server did not get yet
        self.summaries: dict = {}  # line counts of the drifted files (see drifted)

    def check(self, state) -> None:
        if self.pending is not None:
            self._send(state, *self.pending)
        if (state.active_number is None or not state.written or state.blocked
                or state.in_progress is not None):
            return
        bundle = kept_bundle(self.applier.state_dir, state.active_number,
                             state.active_checksum)
        expected = {f["path"]: f["content"] for f in (bundle or {}).get("files", [])
                    if isinstance(f, dict) and isinstance(f.get("content"), str)}
        files = drifted(self.applier.target_dir, state.written,
                        secret_files=state.secret_files, expected=expected,
                        summaries=self.summaries)
        if files:  # a warning when the drifted set is new, not on every cycle
            new = _keys(files) != _keys(state.drift) or not self.reported_since_start
            (logger.warning if new else logger.debug)(
                "%d managed file(s) drifted from #%s: %s", len(files), state.active_number,
                ", ".join(f["path"] for f in files[:10]))
        if self._may_restore(state, files):
            restored, why = self._restore(state, bundle)
            if not restored:
                logger.error("restoring #%s's files failed: %s; not trying again for "
                             "these files", state.active_number, why)
                self.restore_failed_for = self._failure_key(state, files)
            self._send(state, files, restored)
        elif _keys(files) != _keys(state.drift) or (files and not self.reported_since_start):
            self._send(state, files, False)

    @staticmethod
    def _failure_key(state, files: list) -> tuple:
        return state.active_number, state.active_checksum, _keys(files)

    def _may_restore(self, state, files: list) -> bool:
        """Under `restore`, whether to restore `files` now: not when restoring the
        same set of the same snapshot failed before (a new set, none, or another
        snapshot applied forgets that failure)."""
        failed = self.restore_failed_for
        if failed is not None and failed != self._failure_key(state, files):
            self.restore_failed_for = failed = None
        if not files or state.drift_policy != RESTORE:
            return False
        if failed is not None:
            (logger.debug if self.skip_logged else logger.info)(
                "not restoring #%s's files again: restoring these files failed; waiting "
                "for them, or the snapshot, to change", state.active_number)
            self.skip_logged = True
            return False
        self.skip_logged = False
        return True

    def _restore(self, state, bundle: dict | None) -> tuple[bool, str]:
        if bundle is None:  # not kept (an older agent, a lost file): ask the server
            try:
                bundle = self.client.bundle(
                    f"/api/v1/agent/snapshots/{state.active_number}/bundle")
            except ProtocolError as exc:
                return False, f"the snapshot's bundle is not available ({exc})"
            if not isinstance(bundle, dict) or (bundle.get("number"), bundle.get(
                    "checksum")) != (state.active_number, state.active_checksum):
                return False, "the server's bundle is not the applied snapshot"
        modes = {path: record["mode"] for path, record in state.written.items()
                 if record["mode"] >= 0}
        outcome = self.applier.restore(bundle, state, modes=modes)
        logger.info("restoring #%s: %s: %s", state.active_number, outcome.status,
                    outcome.message)
        return outcome.status == "succeeded", outcome.message

    def _send(self, state, files: list, restored: bool) -> None:
        """Report the drifted set; kept (in memory) until the server has it."""
        self.pending = (files, restored)
        body = {"snapshot": state.active_number, "checksum": state.active_checksum,
                "files": files, "restored": restored}
        try:
            self.client.drift(body)
        except ProtocolError as exc:
            if exc.status >= 500 or exc.status == 429 or isinstance(exc, Unauthorized):
                raise
            logger.error("drift report refused: %s", exc)  # e.g. 409: not sent again
        else:
            logger.info("reported %d drifted file(s)%s", len(files),
                        " (restored)" if restored else "")
        self.pending = None
        self.reported_since_start = True
        state.drift = [] if restored else files
        self.persist()
