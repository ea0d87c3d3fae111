"""Atomic file writes and the backup/restore of a target directory's files.

A bundle's path is a plain relative path (`path_problem`), and every path is
joined only through `inside`, with the directory it is written to (or read from):
the target, the staged tree, the backup. `inside` resolves the path's directory
only, and every write, backup and removal acts on the path itself, so a symbolic
link put where a managed file was is replaced (or removed, or backed up as a
link), never written through.

Directories are made with exact modes whatever the umask (`make_directories`):
0755 in the target, 0700 in the state directory and the staged tree.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat

TEMP_MARKER = ".bellwether-tmp-"
# This agent's temp files are named `.<name>.bellwether-tmp-<key>-<random>`: the key
# is random, kept in the state directory, so no snapshot file can carry it, and
# only files with it are ever removed as leftovers. (The server also refuses
# snapshot paths containing TEMP_MARKER.)
_temp_key = {"value": secrets.token_hex(8)}
# Directories made in the target (its new files are 0644), and those holding the
# state, backups, staged snapshots (secrets before their files' modes are final).
DIRECTORY_MODE = 0o755
PRIVATE_DIRECTORY_MODE = 0o700
# A name longer than this is refused by the filesystems the agent writes to (NAME_MAX);
# the server sends paths of at most 255 characters, so at most 1020 bytes.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 1024
# What a temp file keeps of the name it stands for: with the marker, key and random
# part it stays within MAX_NAME_BYTES.
_TEMP_NAME_BYTES = 100


def path_problem(relative) -> str | None:
    """Why `relative` is not a plain relative file path, or None. Such a path stays
    under whatever directory it is joined to (the target, the staged tree one level
    deeper, the backup): not empty, not absolute, no empty, `.` or `..` segment, no
    NUL, UTF-8, names within what a filesystem takes. The server's rule
    (configlang/rendering.py path_problem) is stricter; the agent does not trust it."""
    if not isinstance(relative, str) or not relative:
        return "is empty"
    if "\x00" in relative:
        return "contains a NUL character"
    try:
        encoded = relative.encode("utf-8")
    except UnicodeEncodeError:
        return "is not UTF-8 text"
    if relative.startswith("/"):
        return "is absolute"
    if any(part in ("", ".", "..") for part in relative.split("/")):
        return "has an empty, '.' or '..' segment"
    if len(encoded) > MAX_PATH_BYTES:
        return f"is longer than {MAX_PATH_BYTES} bytes"
    if any(len(part) > MAX_NAME_BYTES for part in encoded.split(b"/")):
        return f"has a name longer than {MAX_NAME_BYTES} bytes"
    return None


def make_directories(path: str, mode: int = DIRECTORY_MODE, *,
                     parents_mode: int | None = None) -> None:
    """Make `path` and the directories above it that are missing, `path` with exactly
    `mode` and the others with `parents_mode` (default `mode`), whatever the umask:
    each is made with its mode (the umask can only narrow it), then chmod-ed to it.
    Directories that exist keep their modes."""
    missing, current = [], os.path.abspath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        wanted = mode if directory == missing[0] else (
            mode if parents_mode is None else parents_mode)
        try:
            os.mkdir(directory, wanted)
        except FileExistsError:
            if os.path.isdir(directory):
                continue  # made meanwhile: not ours to change
            raise
        os.chmod(directory, wanted)


def _temp_path(directory: str, name: str) -> str:
    """A fresh temp path beside `name` in `directory`, carrying this agent's key."""
    encoded = name.encode("utf-8", "surrogateescape")
    if len(encoded) > _TEMP_NAME_BYTES:
        name = encoded[:_TEMP_NAME_BYTES].decode("utf-8", "ignore")
    return os.path.join(directory, f".{name}{TEMP_MARKER}{_temp_key['value']}-"
                                   f"{secrets.token_hex(4)}")


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, mode: int = 0o644, *,
                 directory_mode: int = DIRECTORY_MODE) -> None:
    """Write `data` to `path` so that readers see the old or the new file, never a
    mix: a temp file in the same directory, fsync, rename, fsync the directory. The
    rename replaces what is at `path`: a symbolic link there is replaced, never
    written through. Missing directories are made with `directory_mode`."""
    directory = os.path.dirname(path) or "."
    make_directories(directory, directory_mode)
    temp = _temp_path(directory, os.path.basename(path))
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    _fsync_directory(directory)


def remove_file(path: str, root: str | None = None) -> None:
    """Remove `path`, then the directories above it (up to `root`) left empty, so a
    later snapshot may put a file where a directory was."""
    try:
        os.unlink(path)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        return  # absent, or a directory that is not one of our files
    directory = os.path.dirname(path)
    while (root is not None and os.path.realpath(directory) != os.path.realpath(root)
           and not os.listdir(directory)):
        os.rmdir(directory)
        directory = os.path.dirname(directory)
    _fsync_directory(directory)


def temp_key(state_dir: str) -> str:
    """This agent's temp-file key, kept in `state_dir` (made on first use); later
    writes in this process use it."""
    path = os.path.join(state_dir, "temp-key")
    try:
        with open(path, encoding="ascii") as handle:
            key = handle.read().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        key = ""
    if not (len(key) == 16 and all(c in "0123456789abcdef" for c in key)):
        key = secrets.token_hex(8)
        try:
            make_directories(state_dir, PRIVATE_DIRECTORY_MODE, parents_mode=DIRECTORY_MODE)
            write_atomic(path, key.encode(), mode=0o600,
                         directory_mode=PRIVATE_DIRECTORY_MODE)
        except OSError:
            pass  # a full state directory: the key serves this process only
    _temp_key["value"] = key
    return key


def remove_temp_files(root: str, key: str) -> int:
    """Delete temp files an interrupted write of this agent (`key`) left under `root`;
    any other file, whatever its name, is left alone."""
    mine = f"{TEMP_MARKER}{key}-"
    removed = 0
    for directory, _, names in os.walk(root):
        for name in names:
            if mine in name:
                os.unlink(os.path.join(directory, name))
                removed += 1
    return removed


class LinkLeaves(ValueError):
    """A managed path whose directory is a symbolic link leading out of the target."""


def inside(root: str, relative: str, where: str = "the target directory") -> str:
    """The absolute path of `relative` under `root` (`where` names it): a plain
    relative path (`path_problem`), its directory resolved and inside `root`
    (ValueError otherwise; LinkLeaves when a link leads out), its last component
    not resolved, so a symlink there is acted on, never followed. Call it with the
    directory the path is written to or read from, when it is."""
    root = os.path.realpath(root)
    problem = path_problem(relative)
    if problem:
        lexical = os.path.normpath(os.path.join(root, relative or ""))
        if os.path.commonpath([root, lexical]) != root or lexical == root:
            problem = f"leaves {where}"
        raise ValueError(f"path {relative!r} {problem}")
    path = os.path.join(root, relative)
    parent = os.path.realpath(os.path.dirname(path))
    if os.path.commonpath([root, parent]) != root:
        raise LinkLeaves(f"path {relative!r} leaves {where} through a symbolic link")
    return os.path.join(parent, os.path.basename(path))


def backup(target_dir: str, relative_paths, backup_dir: str) -> dict:
    """Copy the current version of each path (those that exist) to `backup_dir`; a
    symbolic link is kept as what it points to, never followed. Returns the
    manifest: which paths existed before (`links`: those that were links)."""
    if os.path.isdir(backup_dir):
        shutil.rmtree(backup_dir)
    make_directories(backup_dir, PRIVATE_DIRECTORY_MODE)
    existed, links = [], {}
    for relative in sorted(set(relative_paths)):
        source = inside(target_dir, relative)
        if os.path.islink(source):
            links[relative] = os.readlink(source)
        elif os.path.isfile(source):
            destination = inside(backup_dir, relative, "the backup directory")
            make_directories(os.path.dirname(destination), PRIVATE_DIRECTORY_MODE)
            shutil.copy2(source, destination)
            existed.append(relative)
    _fsync_directory(backup_dir)
    return {"existed": existed, "links": links, "paths": sorted(set(relative_paths))}


def restore(target_dir: str, manifest: dict, backup_dir: str) -> None:
    """Put every path of the manifest back as it was: old content and mode, a link,
    or absent. New files go first, so an old file can return where a new directory
    was. (A manifest of an older agent has no `links`.)"""
    existed, links = set(manifest["existed"]), manifest.get("links", {})
    for relative in manifest["paths"]:
        if relative not in existed and relative not in links:
            remove_file(inside(target_dir, relative), target_dir)
    for relative in manifest["existed"]:
        path = inside(target_dir, relative)
        saved = inside(backup_dir, relative, "the backup directory")
        with open(saved, "rb") as handle:
            data = handle.read()
        mode = os.stat(saved).st_mode & 0o7777
        if not _same(path, data, mode):  # unchanged files are not rewritten (read-only)
            write_atomic(path, data, mode=mode)
    for relative, points_to in sorted(links.items()):
        _put_link(inside(target_dir, relative), points_to)


def _put_link(path: str, points_to: str) -> None:
    """Make `path` the symbolic link to `points_to`, replacing whatever is there."""
    if os.path.islink(path) and os.readlink(path) == points_to:
        return
    directory = os.path.dirname(path)
    make_directories(directory)
    temp = _temp_path(directory, os.path.basename(path))
    os.symlink(points_to, temp)
    try:
        os.replace(temp, path)
    except BaseException:
        os.unlink(temp)
        raise
    _fsync_directory(directory)


def _same(path: str, data: bytes, mode: int) -> bool:
    try:
        if os.path.islink(path) or os.stat(path).st_mode & 0o7777 != mode:
            return False
        with open(path, "rb") as handle:
            return handle.read() == data
    except OSError:
        return False


def staging_dir(target_dir: str, key: str) -> str:
    """Where a snapshot is staged before the swap: inside the target directory, so
    on its filesystem (renames are atomic); named like a temp file of this agent."""
    return os.path.join(target_dir, f"{TEMP_MARKER}{key}-staged")


def make_staging(target_dir: str, key: str) -> str:
    """A fresh staging directory (0700: it holds files with secrets before they are
    in place)."""
    path = staging_dir(target_dir, key)
    os.mkdir(path, PRIVATE_DIRECTORY_MODE)
    os.chmod(path, PRIVATE_DIRECTORY_MODE)
    return path


def remove_staging(target_dir: str, key: str) -> bool:
    """Remove the staging directory (a link in its place is removed, never followed)."""
    path = staging_dir(target_dir, key)
    if os.path.islink(path):
        os.unlink(path)
        return True
    if not os.path.isdir(path):
        return False
    shutil.rmtree(path)
    return True


def swap_in(staged: str, target_dir: str, relative_paths) -> None:
    """Move each staged file to its place in the target directory (one rename each),
    then make the renames durable. Each is checked in the staged tree as in the
    target: a link put there while it was validated is never followed, nor moved in."""
    directories = set()
    for relative in relative_paths:
        source = inside(staged, relative, "the staged directory")
        if not stat.S_ISREG(os.lstat(source).st_mode):
            raise ValueError(f"staged {relative!r} is not a regular file")
        destination = inside(target_dir, relative)
        directory = os.path.dirname(destination)
        make_directories(directory)
        os.replace(source, destination)
        directories.add(directory)
    for directory in sorted(directories):
        _fsync_directory(directory)
