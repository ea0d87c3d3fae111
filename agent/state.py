"""The agent's local state, in two files of the state directory, each written
atomically with the previous version kept next to it (`<file>.prev`):

- identity.json: who this agent is (its token and name). Rarely written; a
  corrupt copy falls back to the previous one.
- state.json: what it applied, what it must still report. Written often; a
  corrupt copy is moved aside and the agent goes on from what is on disk.

A state.json from before the split (with the token in it) is migrated on load.

The directory is one agent's: `StateLock` holds a lock on its `lock` file for as
long as the agent runs.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import time
from dataclasses import asdict, dataclass, field

from agent.files import PRIVATE_DIRECTORY_MODE, write_atomic

logger = logging.getLogger("agent.state")

MAX_REMEMBERED_DEPLOYMENTS = 200
STATE_FILE, IDENTITY_FILE, PREVIOUS = "state.json", "identity.json", ".prev"
LOCK_FILE = "lock"


class Corrupt(Exception):
    pass


def _read_json(path: str) -> dict | None:
    """The JSON object in `path`; None when absent; Corrupt when unreadable as one."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Corrupt(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise Corrupt(f"not a JSON object but {type(data).__name__}")
    return data


def write_with_previous(path: str, data: dict, *, always_two: bool = False) -> None:
    """Keep the current `path` as `path.prev`, then write `data` atomically.
    `always_two`: with no current file, `path.prev` gets `data` too (the identity
    is written once: its second copy must exist from the start)."""
    text = json.dumps(data, indent=2).encode("utf-8")  # fails before touching a file
    try:
        with open(path, "rb") as handle:
            current = handle.read()
    except FileNotFoundError:
        current = None
    if current is not None:
        try:
            json.loads(current.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            current = None  # never keep a corrupt copy as the previous one
    if current is None and always_two:
        current = text
    private = {"mode": 0o600, "directory_mode": PRIVATE_DIRECTORY_MODE}
    if current is not None:
        write_atomic(path + PREVIOUS, current, **private)
    write_atomic(path, text, **private)


def move_aside(path: str, why: str) -> str:
    aside = f"{path}.corrupt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
    os.replace(path, aside)
    logger.error("%s is corrupt (%s); moved it to %s", path, why, aside)
    return aside


@dataclass
class State:
    active_number: int | None = None
    active_checksum: str | None = None
    active_label: str | None = None
    # Paths (relative to the target directory) the active snapshot wrote.
    managed_files: list = field(default_factory=list)
    etag: str | None = None
    # A failed (number, checksum), not retried until the desired one changes.
    blocked: dict | None = None
    # Push deployment ids already applied -> the report sent for each.
    processed_deployments: dict = field(default_factory=dict)
    unsent_report: dict | None = None
    # Set while an apply is changing files; found on start-up after a crash.
    in_progress: dict | None = None
    # The server's poll interval, kept so a restart answered 304 keeps its pace.
    poll_interval_s: float | None = None
    # The environment's drift policy (report | restore), kept like the interval.
    drift_policy: str = "report"
    # What the last successful apply wrote (agent/drift.py): path -> {sha256, mode},
    # the paths that received a secret, and the drifted files last reported.
    written: dict = field(default_factory=dict)
    secret_files: list = field(default_factory=list)
    drift: list = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: dict) -> State:
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        state = cls(**known)
        problem = state._problem()
        if problem:
            raise Corrupt(problem)
        return state

    def _problem(self) -> str | None:
        """What makes this state unusable (wrong types a crash would follow), or None."""
        def strings(value) -> bool:
            return isinstance(value, list) and all(isinstance(v, str) for v in value)
        if not strings(self.managed_files):
            return "managed_files is not a list of paths"
        if not isinstance(self.processed_deployments, dict):
            return "processed_deployments is not an object"
        if not (isinstance(self.written, dict) and all(
                isinstance(r, dict) and isinstance(r.get("sha256"), str)
                and isinstance(r.get("mode"), int) for r in self.written.values())):
            return "written is not a record of files"
        if not strings(self.secret_files):
            return "secret_files is not a list of paths"
        if not (isinstance(self.drift, list) and all(
                isinstance(f, dict) and isinstance(f.get("path"), str) for f in self.drift)):
            return "drift is not a list of files"
        for name in ("blocked", "unsent_report", "in_progress"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), dict):
                return f"{name} is not an object"
        if self.active_number is not None and not isinstance(self.active_number, int):
            return "active_number is not a number"
        progress = self.in_progress
        if progress is not None:
            manifest = progress.get("manifest")
            if not (isinstance(progress.get("number"), int) and isinstance(manifest, dict)
                    and strings(manifest.get("existed")) and strings(manifest.get("paths"))):
                return "in_progress is not a recorded apply"
        return None

    @classmethod
    def load(cls, path: str) -> State:
        """The state in `path`. A corrupt file is moved aside (logged): the agent
        starts afresh, keeping only the list of files it managed (from the previous
        copy, if that one reads), so it still removes them when a snapshot drops them."""
        try:
            data = _read_json(path)
            return cls() if data is None else cls.from_dict(data)
        except (Corrupt, TypeError) as exc:
            move_aside(path, str(exc))
        try:
            previous = cls.from_dict(_read_json(path + PREVIOUS) or {})
        except (Corrupt, TypeError):
            previous = cls()
        logger.warning("going on from the files on disk: the desired snapshot is applied "
                       "again over them")
        return cls(managed_files=previous.managed_files)

    def save(self, path: str) -> None:
        if len(self.processed_deployments) > MAX_REMEMBERED_DEPLOYMENTS:
            newest = list(self.processed_deployments.items())[-MAX_REMEMBERED_DEPLOYMENTS:]
            self.processed_deployments = dict(newest)
        # Not sorted: processed_deployments keeps its order, oldest first.
        write_with_previous(path, asdict(self))

    def is_blocked(self, number: int, checksum: str) -> bool:
        return self.blocked == {"number": number, "checksum": checksum}


@dataclass
class Identity:
    token: str | None = None
    name: str | None = None

    @classmethod
    def load(cls, state_dir: str) -> Identity:
        """identity.json, else its previous copy, else the token of a state.json
        from before the split (migrated: written to identity.json)."""
        path = identity_path(state_dir)
        for candidate in (path, path + PREVIOUS):
            try:
                data = _read_json(candidate)
            except Corrupt as exc:
                logger.error("%s is corrupt (%s); trying the previous copy", candidate, exc)
                continue
            if data is not None and isinstance(data.get("token"), str):
                if candidate != path:
                    logger.warning("using the previous identity %s", candidate)
                return cls(token=data["token"], name=data.get("name"))
        try:
            legacy = _read_json(state_path(state_dir)) or {}
        except Corrupt:
            legacy = {}
        if isinstance(legacy.get("token"), str):
            identity = cls(token=legacy["token"])
            try:
                identity.save(state_dir)
                logger.info("moved the token from state.json to identity.json")
            except OSError as exc:
                logger.error("cannot write identity.json (%s); using the token in state.json",
                             exc)
            return identity
        return cls()

    def save(self, state_dir: str) -> None:
        write_with_previous(identity_path(state_dir), asdict(self), always_two=True)


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, STATE_FILE)


def identity_path(state_dir: str) -> str:
    return os.path.join(state_dir, IDENTITY_FILE)


class InUse(Exception):
    """Another process holds the state directory's lock."""


class StateLock:
    """The lock of a state directory: an exclusive flock on `<state-dir>/lock`, held
    until the process ends (the kernel drops it then, however it ends: a lock file
    left by a dead agent never blocks). The file names the holder (its pid and
    name) for the message of an agent refused; commands never inherit it."""

    def __init__(self, fd: int):
        self.fd = fd

    @classmethod
    def acquire(cls, state_dir: str, name: str) -> StateLock:
        """The lock, or InUse naming its holder."""
        path = os.path.join(state_dir, LOCK_FILE)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            holder = _holder(fd)
            os.close(fd)
            raise InUse(holder) from None
        lock = cls(fd)
        os.fchmod(fd, 0o600)
        lock.name(name)
        return lock

    def name(self, name: str) -> None:
        """Write who holds the lock (this process, as `name`)."""
        text = json.dumps({"pid": os.getpid(), "name": name}).encode("utf-8")
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, text + b"\n", 0)

    def release(self) -> None:
        os.close(self.fd)


def _holder(fd: int) -> str:
    """"pid 123, web-1" from the lock file of the holder (who may be writing it just
    now: it is read again for a moment while empty)."""
    deadline = time.monotonic() + 0.5
    while True:
        try:
            data = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            data = None
        if isinstance(data, dict) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    if not isinstance(data, dict) or not isinstance(data.get("pid"), int):
        return "pid unknown"
    name = data.get("name")
    return f"pid {data['pid']}" + (f", {name}" if isinstance(name, str) and name else "")
