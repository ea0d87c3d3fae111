"""Resolving the secrets a bundle's manifest lists (docs/agents.md, "Secrets").

The server's renderer puts a sealed placeholder where an environment's template
placed a secret, and lists each placeholder with its reference in the bundle's
`secrets` manifest. This agent substitutes exactly those placeholders, in the
files the manifest names, and nothing else: any other `${secret:...}` text is
left as text. A reference must also match this host's --secret-allow list.
`file:` references must be regular files of at most MAX_SECRET_FILE_BYTES.
Files receiving a secret get the bundle's `secret_file_mode` (the environment's
declaration, "0640"), else 0600: never anything for others nor write for the group.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import stat
from urllib.parse import unquote

MAX_SECRET_FILE_BYTES = 1024 * 1024
# Resolved values at least this long are written as REDACTED in whatever the agent
# reports or logs of its commands' and probes' output (shorter ones would mangle it).
MIN_REDACTED_LENGTH = 4
REDACTED = "[secret]"
SECRET_TEXT = "${secret:"
# configlang/secrets.py's PLACEHOLDER, exactly: the checksum depends on it.
PLACEHOLDER = re.compile(
    r"\$\{secret:sealed:([0-9a-f]{32}):"
    r"((?:env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\s}]+|vault:[^\s#}]+#[^\s#}]+))\}")


DEFAULT_SECRET_FILE_MODE = 0o600
_OCTAL_MODE = re.compile(r"0?[0-7]{3}")


def secret_file_mode(bundle: dict) -> int:
    """The mode of the files receiving secrets: the bundle's `secret_file_mode`, or
    0600. The server's rule (configlang/secrets.py), checked again here."""
    value = bundle.get("secret_file_mode")
    if value is None:
        return DEFAULT_SECRET_FILE_MODE
    if not isinstance(value, str) or not _OCTAL_MODE.fullmatch(value):
        raise SecretError(f"the bundle's secret_file_mode {value!r} is not an octal mode")
    mode = int(value, 8)
    if mode & 0o027 or not mode & 0o400:
        raise SecretError(f"the bundle's secret_file_mode {value} would let others read "
                          "or the group write a secret, or the owner not read it")
    return mode


def unsealed(content: str) -> str:
    """`content` with each sealed placeholder written as `${secret:<reference>}`."""
    if "${secret:sealed:" not in content:
        return content
    return PLACEHOLDER.sub(lambda m: "${secret:" + m.group(2) + "}", content)


class SecretError(Exception):
    pass


def parse_allow(text) -> list | None:
    """`env:SHOP_*,file:/etc/shop/` -> patterns; None (or empty) allows every reference."""
    if text is None:
        return None
    if isinstance(text, (list, tuple)):
        return list(text) or None
    patterns = [p.strip() for p in str(text).split(",") if p.strip()]
    return patterns or None


def allowed(reference: str, patterns) -> bool:
    """A pattern ending in "/" is a directory prefix; any other is a glob."""
    if patterns is None:
        return True
    for pattern in patterns:
        if pattern.endswith("/") and reference.startswith(pattern):
            return True
        if fnmatch.fnmatchcase(reference, pattern):
            return True
    return False


def read_secret_file(path: str, limit: int = MAX_SECRET_FILE_BYTES) -> str:
    """The content of a regular file of at most `limit` bytes, without its final
    newline. A fifo, device, directory, or a bigger file is refused; opening never
    blocks (O_NONBLOCK) and the checks are made on the opened file."""
    if not os.path.isabs(path):
        raise SecretError("is not an absolute path")
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise SecretError(f"cannot be read ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretError("is not a regular file")
        if info.st_size > limit:
            raise SecretError(f"is larger than {limit} bytes")
        data = os.read(fd, limit + 1)
        if len(data) > limit:
            raise SecretError(f"is larger than {limit} bytes")
    finally:
        os.close(fd)
    try:
        return data.decode("utf-8").rstrip("\n")
    except UnicodeDecodeError:
        raise SecretError("is not UTF-8 text") from None


def _value(reference: str, environ, patterns) -> str:
    kind, _, name = reference.partition(":")
    # As the server refuses them (configlang/secrets.py): a vault path with an empty,
    # `.` or `..` segment would escape --secret-allow patterns such as vault:kv/shop/*.
    # A segment holding an encoded /, \ or % (`..%2f`, `%252e`) would hide one.
    if kind == "vault" and any(unquote(s) in ("", ".", "..")
                               or any(c in unquote(s) for c in "/\\%")
                               for s in name.partition("#")[0].split("/")):
        raise SecretError("has an empty, `.` or `..` path segment, or an encoded /, \\ or %")
    # A file is checked where it really is: after `..` and symbolic links.
    checked = "file:" + os.path.realpath(name) if kind == "file" else reference
    if not allowed(checked, patterns):
        raise SecretError("is outside this agent's --secret-allow")
    if kind == "env":
        if name not in environ:
            raise SecretError("is not set in the agent's environment")
        return environ[name]
    if kind == "file":
        return read_secret_file(name)
    raise SecretError(f"is of a kind this agent does not resolve ({kind}:)")


def _manifest(bundle: dict) -> list | None:
    listed = bundle.get("secrets")
    if listed is None:
        return None
    def well_formed(entry) -> bool:
        match = PLACEHOLDER.fullmatch(entry.get("placeholder") or "") \
            if isinstance(entry, dict) and isinstance(entry.get("placeholder"), str) else None
        return (match is not None and entry.get("reference") == match.group(2)
                and isinstance(entry.get("files"), list)
                and all(isinstance(f, str) for f in entry["files"]))

    if not isinstance(listed, list) or not all(well_formed(e) for e in listed):
        raise SecretError("the bundle's secrets manifest is malformed")
    return listed


def _forms(value: str) -> set:
    """A value as output may hold it: as is, each of its lines, and escaped as JSON
    and as a Python string literal would write it."""
    forms = {value, *value.splitlines(), json.dumps(value)[1:-1],
             json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1]}
    return {form for form in forms if len(form.strip()) >= MIN_REDACTED_LENGTH}


def redact(text: str, values, *, cut: bool = False) -> str:
    """`text` with each of the secret `values` (in every form `_forms` lists,
    longest first) written as REDACTED. With `cut` (the text was cut short), an
    end that is the start of a value is redacted too."""
    pieces = {form for value in values for form in _forms(value)}
    for piece in sorted(pieces, key=len, reverse=True):
        text = text.replace(piece, REDACTED)
    started = _started_value(text, pieces) if cut else 0
    return text[:-started] + REDACTED if started else text


def _started_value(text: str, pieces) -> int:
    """The length of the longest end of `text` that is the start of one of `pieces`
    (a value cut short), 0 when none; the last 4096 characters are looked at."""
    longest = 0
    for piece in pieces:
        first = max(len(text) - min(len(piece) - 1, 4096), 0)
        for i in range(first, len(text) - longest):
            if piece.startswith(text[i:]):
                longest = len(text) - i
                break
    return longest


def resolve(bundle: dict, environ, patterns=None) -> tuple:
    """(files with the manifest's placeholders substituted, the set of paths that
    received a secret, the resolved values). Every reference that cannot be
    resolved is reported together, before anything is written."""
    entries = bundle["files"]
    listed = _manifest(bundle)
    if listed is None:
        if any(SECRET_TEXT in e["content"] for e in entries):
            raise SecretError("this snapshot has no secrets manifest (it was published "
                              "before manifests existed) and holds ${secret:...} text, "
                              "which is not resolved: publish it again")
        return entries, set(), set()
    values, problems = {}, []
    for item in listed:
        placeholder, reference = item["placeholder"], item["reference"]
        if placeholder in values:
            continue
        if not any(placeholder in e["content"] for e in entries
                   if e["path"] in item["files"]):
            continue
        try:
            values[placeholder] = _value(reference, environ, patterns)
        except SecretError as exc:
            problems.append(f"{reference} {exc}")
    if problems:
        raise SecretError("secret reference(s) not resolved: "
                          + "; ".join(sorted(set(problems))))
    where: dict = {}
    for item in listed:
        where.setdefault(item["placeholder"], set()).update(item["files"])
    resolved, receiving = [], set()
    for entry in entries:
        mine = [p for p in values if entry["path"] in where[p]]
        content = entry["content"]
        if mine:
            # One pass: a secret's value is never searched for placeholders again.
            pattern = re.compile("|".join(re.escape(p) for p in sorted(mine, key=len,
                                                                       reverse=True)))
            content, count = pattern.subn(lambda m: values[m.group(0)], content)
            if count:
                receiving.add(entry["path"])
        resolved.append({"path": entry["path"], "content": content})
    return resolved, receiving, set(values.values())
