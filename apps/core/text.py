"""What text the server accepts: no NUL and no lone surrogates anywhere (neither
PostgreSQL nor UTF-8 can hold them), and in names, labels and paths no control,
format (bidirectional overrides, zero-width), default-ignorable or separator
characters, no space but U+0020 and no whitespace at either end either
(configlang.visible), so what a person reads is what is stored. Pure rules, no Django."""

import unicodedata
from urllib.parse import unquote_to_bytes

from configlang.visible import INVISIBLE_CATEGORIES, invisible_problem, is_default_ignorable

REPLACEMENT = "\ufffd"


def text_problem(value: str) -> str | None:
    """Why `value` is not storable text, or None."""
    if "\x00" in value:
        return "contains a NUL character"
    if any("\ud800" <= char <= "\udfff" for char in value):
        return "contains a lone surrogate (not valid Unicode)"
    return None


def url_text_problem(value: str | bytes, *, path: bool = True) -> str | None:
    """Why a URL path (or, path=False, a query part) is not text, or None:
    percent-decoded it must be UTF-8; a path holds no U+FFFD either (the mark of a
    byte a server could not decode, so `a%FFb` and `a%EF%BF%BDb` never name the
    same file)."""
    try:
        decoded = unquote_to_bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        return "is not valid UTF-8 once percent-decoded"
    if path and "\ufffd" in decoded:
        return "contains U+FFFD (a byte that is not valid UTF-8)"
    return None


def neutralised(value: str) -> str:
    """Free text an agent reports (a report's message, its health probe's output),
    made safe to show: CRLF becomes LF, and every control, format (bidirectional
    overrides, zero-width), default-ignorable, private-use, unassigned, separator or
    surrogate character but LF and tab becomes U+FFFD — an ANSI escape, a lone CR
    or U+202E cannot rewrite what a dashboard or a log shows. Kept rather than
    refused: a command's output is the evidence, and the report must not be lost."""
    value = value.replace("\r\n", "\n")
    return "".join(
        REPLACEMENT if char not in "\n\t" and (
            unicodedata.category(char) in INVISIBLE_CATEGORIES or is_default_ignorable(char))
        else char for char in value)


def name_problem(value: str) -> str | None:
    """Why `value` may not be a name, label or path, or None."""
    return text_problem(value) or invisible_problem(value)


def whole_number(text: str, *, maximum: int) -> int | None:
    """`text` as a number when it is plain ASCII digits (no sign, space, point, or a
    digit such as "٣" or "²") of at most `maximum`, else None. Its length is checked
    before int(): a long run of digits costs nothing to refuse."""
    if not (text.isascii() and text.isdigit()) or len(text.lstrip("0")) > len(str(maximum)):
        return None
    value = int(text)
    return value if value <= maximum else None


def _join(prefix: str, key) -> str:
    return f"{prefix}.{key}" if prefix else str(key)


def first_text_problem(data, prefix: str = "") -> tuple[str, str] | None:
    """(field path, problem) for the first key or string in a parsed body that is not
    storable text, or None. Keys are named by their path, with the problem."""
    if isinstance(data, str):
        problem = text_problem(data)
        return (prefix, problem) if problem else None
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str):
                problem = text_problem(key)
                if problem:
                    shown = key.encode("utf-8", "backslashreplace").decode()
                    shown = shown.replace("\x00", "\\x00")
                    return (_join(prefix, shown), f"the key {problem}")
            found = first_text_problem(value, _join(prefix, key))
            if found:
                return found
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found = first_text_problem(value, f"{prefix}[{index}]")
            if found:
                return found
    return None
