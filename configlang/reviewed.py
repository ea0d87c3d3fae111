"""Every filter, test and global a template may use, reviewed one by one for
what its cost grows with. A name Jinja defines that is in neither REVIEWED nor
REMOVED is dropped from the sandbox (and fails tests/configlang), so a newer
Jinja cannot expose an unreviewed builtin.

Each entry says how the filter is bounded: "size" — its argument decides the
result's size and configlang.budget.FILTER_CHECKS checks it before the call;
"input" — linear (or n log n) in a value that is itself bounded by the budget,
checked on the result by RenderBudget.produced; "numeric" — its cost grows with
an operand's magnitude and FILTER_CHECKS bounds the operand before the call;
"lazy" — it calls other filters or tests, each charged on its own.
"""

REVIEWED_FILTERS = {
    "abs": "input: ints are at most MAX_INT_BITS bits",
    "attr": "input: a sandboxed attribute lookup",
    "batch": "size: the batch size and fill value",
    "capitalize": "input", "center": "size: the width",
    "count": "input", "length": "input",
    "d": "input", "default": "input",
    "dictsort": "input: n log n", "sort": "input: n log n", "unique": "input",
    "groupby": "input: n log n",
    "e": "input", "escape": "input", "forceescape": "input", "safe": "input",
    "filesizeformat": "numeric: float conversion, a fixed number of steps",
    "first": "input", "last": "input", "random": "input", "reverse": "input",
    "float": "numeric: linear in the text; overflow is a template_error",
    "int": "numeric: text longer than MAX_NUMBER_DIGITS is refused before conversion",
    "format": "size: printf widths and precisions",
    "indent": "size: the indent width times the lines",
    "items": "input", "list": "input", "string": "input", "pprint": "input",
    "join": "size: the separator times the items",
    "lower": "input", "upper": "input", "title": "input", "trim": "input",
    "striptags": "input", "wordcount": "input",
    "map": "lazy", "select": "lazy", "reject": "lazy", "selectattr": "lazy",
    "rejectattr": "lazy",
    "max": "input", "min": "input",
    "replace": "size: the replacement times the occurrences",
    "round": "numeric: |precision| at most MAX_ROUND_DIGITS",
    "slice": "size: the slice count and fill value",
    "sum": "input: ints at most MAX_INT_BITS bits; range() at most 100000 items",
    "tojson": "size: the indent",
    "truncate": "input",
    "urlencode": "input", "urlize": "size: target and rel per word",
    "wordwrap": "size: the wrap string per line", "xmlattr": "input",
}

# Jinja filters the sandbox does not offer at all.
REMOVED_FILTERS: dict[str, str] = {}

REVIEWED_TESTS = {
    **dict.fromkeys(("!=", "<", "<=", "==", ">", ">=", "eq", "equalto", "ne", "ge",
                     "greaterthan", "gt", "le", "lessthan", "lt", "sameas", "in"),
                    "input: a comparison, charged as one operation"),
    "divisibleby": "numeric: ints at most MAX_INT_BITS bits",
    **dict.fromkeys(("boolean", "callable", "defined", "undefined", "escaped", "even", "odd",
                     "false", "true", "float", "integer", "iterable", "lower", "upper",
                     "mapping", "none", "number", "sequence", "string", "filter", "test"),
                    "input: constant time or linear"),
}

REMOVED_TESTS: dict[str, str] = {}

REVIEWED_GLOBALS = {
    "range": "size: the sandbox refuses ranges of more than 100000 items",
    "dict": "input", "namespace": "input", "cycler": "input", "joiner": "input",
}

REMOVED_GLOBALS = {"lipsum": "builds text of any size; no use in a config file"}
