"""One budget per render: operations, value size, bytes produced, call depth and
wall time. The sandbox (configlang.sandbox) charges it on every operation a
template can perform, and checks the arguments of every call that could build a
large value *before* the value is built, so no construct outruns it.
"""

import re
import string
import time

from jinja2.exceptions import SecurityError
from jinja2.utils import Namespace

MAX_INT_BITS = 100_000
MAX_CALL_DEPTH = 100
MAX_ROUND_DIGITS = 100  # round(12345, -10**9) computes 10**(10**9) in C, holding the GIL
MAX_NUMBER_DIGITS = 4300  # as Python's own int <-> str conversion limit
SAFE_CODECS = frozenset(("utf-8", "utf8", "ascii", "latin-1", "latin1", "iso-8859-1",
                         "utf-16", "utf-32"))
DEFAULT_RENDER_SECONDS = 5.0


class RenderLimit(SecurityError):
    """A render went over its budget. Reported as `render_limit`, naming the
    template and line it happened at."""


class RenderBudget:
    """`operations`: calls, attribute and item lookups, operators, loop iterations,
    output; `value_bytes`: the largest string, list or dict a template may build;
    `total_bytes`: everything built in one render, together; `seconds`: wall time
    from the first operation charged (compiling a template is not charged; the
    compiled templates are shared, see configlang.sandbox)."""

    def __init__(self, *, operations: int, value_bytes: int, total_bytes: int,
                 seconds: float = DEFAULT_RENDER_SECONDS):
        self.operations, self.value_bytes, self.total_bytes = operations, value_bytes, total_bytes
        self.seconds = seconds
        self.left = operations
        self.produced_bytes = 0
        self.depth = 0
        self.deadline = None  # set by the first charge: compiling is not rendering
        # Set when the render stopped for a reason the server's load decides (its
        # deadline, memory), not the template alone: such an outcome is not remembered.
        self.load_dependent = False
        self.timed_out = False  # stopped at its deadline: a busy server, not the template

    def charge(self, count: int = 1) -> None:
        self.left -= count
        if self.left < 0:
            raise RenderLimit(f"the render ran more than {self.operations} operations")
        if self.deadline is None:
            self.deadline = time.monotonic() + self.seconds
        elif time.monotonic() > self.deadline:
            self.load_dependent = self.timed_out = True
            raise RenderLimit(f"the render took longer than {self.seconds:g} seconds")

    def require(self, size: int, what: str) -> None:
        """Refuse building a value of `size` (characters or items) before it is built."""
        if size > self.value_bytes:
            raise RenderLimit(f"{what} would build a value of about {size} characters or "
                              f"items; the limit is {self.value_bytes}")
        if self.produced_bytes + size > self.total_bytes:
            raise RenderLimit(f"the render would build more than {self.total_bytes} bytes "
                              "of values in all")

    def produced(self, value):
        """Account for a value the template just built; returns it."""
        if type(value) is str:
            size = len(value)
            if size > self.value_bytes or self.produced_bytes + size > self.total_bytes:
                self.require(size, "this")
            self.produced_bytes += size
        elif isinstance(value, int) and not isinstance(value, bool):
            if value.bit_length() > MAX_INT_BITS:
                raise RenderLimit(f"a number of more than {MAX_INT_BITS} bits")
        elif isinstance(value, (str, bytes)):
            self.require(len(value), "this")
            self.produced_bytes += len(value)
        elif isinstance(value, (list, tuple, dict, set, frozenset)):
            # Walked (up to the limit): a container holding itself many times over
            # would make comparing, hashing or printing it take forever.
            size = self.text_size(value)
            self.require(size, "this")
            self.produced_bytes += len(value)
        return value

    def text_size(self, value) -> int:
        """The length `str(value)` would have, estimated without building it (never
        less than it for strings and containers; stops past the size limit)."""
        return estimate_size(value, self.value_bytes + 1)


def estimate_size(value, cap: int) -> int:
    """About len(str(value)), walking containers, stopping once past `cap`."""
    total, stack = 0, [value]
    while stack and total <= cap:
        item = stack.pop()
        if isinstance(item, (str, bytes)):
            total += len(item) * (1 if isinstance(item, str) else 4) + 2
        elif isinstance(item, bool) or item is None:
            total += 5
        elif isinstance(item, int):
            total += item.bit_length() * 3 // 10 + 2
        elif isinstance(item, dict):
            total += 2 + 4 * len(item)
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(item)
            stack.extend(item)
        elif isinstance(item, Namespace):
            stack.append(object.__getattribute__(item, "_Namespace__attrs"))
            total += 16
        else:
            total += 64
    return total


# --- arguments that decide a result's size -----------------------------------------

_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)


def check_printf(budget: RenderBudget, template, args) -> None:
    """`template % args`: refuse `*` widths, and widths/precisions or arguments that
    would make the result larger than the budget allows."""
    if not isinstance(template, str):
        return
    need = len(template) + budget.text_size(args)
    for match in _PRINTF.finditer(template):
        width, precision = match.group(1), match.group(2)
        if "*" in (width, precision):
            raise RenderLimit("a '*' width or precision in %-formatting is not allowed")
        need += int(width or 0) + int(precision or 0)
    budget.require(need, "this %-formatting")


def check_format(budget: RenderBudget, template, args, kwargs) -> None:
    """`template.format(...)`: refuse nested fields in format specs and widths that
    would make the result larger than the budget allows."""
    if not isinstance(template, str):
        return
    need = len(template) + budget.text_size([args, kwargs])
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:
        return  # the call itself reports the bad format string
    for _, _, spec, _ in fields:
        if spec and "{" in spec:
            raise RenderLimit("a nested field in a format spec is not allowed")
        need += sum(int(n) for n in re.findall(r"\d+", spec or ""))
    budget.require(need, "this format")


def _int(value, default=0) -> int:
    return value if isinstance(value, int) else default


def _width(budget, s, width, *_args, **_kw):
    budget.require(max(budget.text_size(s), _int(width)), "this width")


def _replace_size(budget, s, old="", new="", count=-1, *_a, **_kw) -> None:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return
    times = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        times = min(times, count)
    budget.require(len(s) + times * max(0, len(new) - len(old)), "this replace")


def _join_size(budget, separator, items, *_a, **_kw) -> None:
    count = len(items) if hasattr(items, "__len__") else 0
    sep = len(separator) if isinstance(separator, (str, bytes)) else 0
    budget.require(budget.text_size(items) + count * sep, "this join")


def _expandtabs(budget, s, tabsize=8, *_a, **_kw):
    if isinstance(s, (str, bytes)):
        tab = "\t" if isinstance(s, str) else b"\t"
        budget.require(len(s) + s.count(tab) * max(0, _int(tabsize, 8)), "this expandtabs")


def _translate(budget, s, table=None, *_a, **_kw):
    if not isinstance(table, dict):
        raise RenderLimit("translate needs a dict")
    longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
    budget.require(len(s) * max(1, longest), "this translate")


def _to_bytes(budget, number, length=1, *_a, **_kw):
    budget.require(_int(length, 1), "to_bytes")


def _codec(budget, s, encoding="utf-8", *_a, **_kw):
    """encode/decode with a plain codec only: some (punycode, idna) take quadratic time."""
    if not isinstance(encoding, str) or encoding.lower().replace("_", "-") not in SAFE_CODECS:
        raise RenderLimit(f"the codec {encoding!r} is not allowed; use one of "
                          f"{', '.join(sorted(SAFE_CODECS))}")


# Methods of str/bytes/int that decide their result's size from an argument,
# checked before the call: name -> check(budget, self, *args, **kwargs).
METHOD_CHECKS = {
    "center": _width, "ljust": _width, "rjust": _width, "zfill": _width,
    "replace": _replace_size, "join": _join_size, "expandtabs": _expandtabs,
    "translate": _translate, "to_bytes": _to_bytes, "encode": _codec, "decode": _codec,
}


def guard_method(budget: RenderBudget, obj, args, kwargs) -> None:
    bound = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
    owner = getattr(bound, "__self__", None)
    name = getattr(bound, "__name__", "")
    if isinstance(owner, (str, bytes, int)) and name in METHOD_CHECKS:
        METHOD_CHECKS[name](budget, owner, *args, **kwargs)
    elif isinstance(owner, str) and name in ("format", "format_map"):
        check_format(budget, owner, args, kwargs)


# --- filters -------------------------------------------------------------------------


def _text_of(budget, value, *_a, **_kw):
    budget.require(budget.text_size(value), "this filter")


def _indent(budget, s, width=4, *_a, **_kw):
    step = len(width) if isinstance(width, str) else _int(width, 4)
    lines = s.count("\n") + 1 if isinstance(s, str) else 1
    budget.require(budget.text_size(s) + lines * max(0, step), "this indent")


def _replace_filter(budget, s, old="", new="", count=None, *_a, **_kw):
    budget.require(budget.text_size(s), "this replace")
    _replace_size(budget, str(s), old, new, -1 if count is None else count)


def _join_filter(budget, value, d="", *_a, **_kw):
    _join_size(budget, d, value)


def _format_filter(budget, value, *args, **kwargs):
    check_printf(budget, value, kwargs or args)


def _wordwrap(budget, s, width=79, break_long_words=True, wrapstring=None, *_a, **_kw):
    size = budget.text_size(s)
    budget.require(size + (size + 1) * len(wrapstring or "\n"), "this wordwrap")


def _urlize(budget, value, trim_url_limit=None, nofollow=False, target=None, rel=None,
            *_a, **_kw):
    size = budget.text_size(value)
    words = len(value.split()) if isinstance(value, str) else 1
    budget.require(3 * size + words * (len(target or "") + len(rel or "") + 64), "urlize")


def _tojson(budget, value, indent=None, *_a, **_kw):
    step = len(indent) if isinstance(indent, str) else _int(indent)
    if step > 16:
        raise RenderLimit("a JSON indent of more than 16 is not allowed")
    budget.require(budget.text_size(value) * (1 + step // 2), "this tojson")


def _count(budget, value, count=None, fill_with=None, *_a, **_kw):
    fill = budget.text_size(fill_with) if fill_with is not None else 1
    budget.require(_int(count) * max(1, fill), "this count")


def _sum(budget, iterable, attribute=None, start=0, *_a, **_kw):
    if not isinstance(start, (int, float)):
        budget.require(budget.text_size(iterable) + budget.text_size(start), "this sum")


def _round(budget, value, precision=0, *_a, **_kw):
    if isinstance(precision, int) and abs(precision) > MAX_ROUND_DIGITS:
        raise RenderLimit(f"round to more than {MAX_ROUND_DIGITS} digits is not allowed")


def _number_text(budget, value, *_a, **_kw):
    if isinstance(value, (str, bytes)) and len(value) > MAX_NUMBER_DIGITS:
        raise RenderLimit(f"a number written with more than {MAX_NUMBER_DIGITS} characters")


# Filters whose cost or result size depends on their arguments, checked before the call:
# name -> check(budget, value, *args, **kwargs).
FILTER_CHECKS = {
    "center": _width, "indent": _indent, "replace": _replace_filter, "join": _join_filter,
    "format": _format_filter, "wordwrap": _wordwrap, "urlize": _urlize, "tojson": _tojson,
    "batch": _count, "slice": _count, "sum": _sum, "round": _round,
    "int": _number_text, "float": _number_text,
    **dict.fromkeys(("string", "pprint", "e", "escape", "forceescape", "urlencode",
                     "xmlattr", "list", "title", "upper", "lower", "capitalize", "striptags",
                     "wordcount", "truncate", "trim", "safe"), _text_of),
}
