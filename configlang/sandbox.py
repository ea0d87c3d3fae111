"""The Jinja2 sandbox file templates render in.

Immutable (a template cannot change the config the next one sees), strict about
undefined names, and bounded: every operation a template can perform — a call
(filter, test, method, macro), an attribute or item lookup, an operator, a
loop iteration, a piece of output — draws on one budget per render
(configlang.budget): operations, the size of any value, the bytes built in all,
macro call depth and wall time. Arguments that decide how large a result is
(widths, repeat counts, replace counts, format specs) are checked before the
result is built. The optimizer is off, so nothing is evaluated at compile time.
"""

import functools
import json
import os
import sys
import threading
from collections import OrderedDict

from jinja2 import (
    BytecodeCache,
    FunctionLoader,
    StrictUndefined,
    Undefined,
    nodes,
    pass_context,
)
from jinja2.exceptions import SecurityError, TemplateSyntaxError
from jinja2.runtime import Macro
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import _PassArg
from jinja2.visitor import NodeTransformer

from configlang.budget import (
    FILTER_CHECKS,
    MAX_CALL_DEPTH,
    MAX_INT_BITS,
    RenderBudget,
    RenderLimit,
    check_printf,
    guard_method,
)
from configlang.reviewed import REVIEWED_FILTERS, REVIEWED_GLOBALS, REVIEWED_TESTS

MAX_POWER_BITS = MAX_INT_BITS
MACRO_CALL_COST = 20
MAX_STACK_FRAMES = 400
# Brackets and unary operators (not, -, +) nested in one expression: Jinja's parser
# and Python's compiler recurse on them, and fail (RecursionError, SyntaxError) far
# from the template's line; refused, naming the line, before parsing.
MAX_NESTING = 32
_OPENING = frozenset(("lparen", "lbracket", "lbrace"))
_CLOSING = frozenset(("rparen", "rbracket", "rbrace"))
_UNARY = frozenset(("sub", "add"))
# Operators, filters and lookups chained in one tag: parsed in a loop but compiled
# recursively (a left-deep tree), so bounded too.
MAX_CHAIN = 100
_CHAINED = frozenset(("add", "sub", "mul", "div", "floordiv", "mod", "pow", "pipe", "dot",
                      "eq", "ne", "lt", "lteq", "gt", "gteq"))
_CHAINED_NAMES = frozenset(("and", "or", "is", "in", "if"))
_TAG_START = frozenset(("variable_begin", "block_begin"))
# Tokens in one template (tag delimiters, names, operators, literals, text runs):
# compiling costs about 30 µs a token, in the process that saves the template
# and in each render's child, so this keeps a compile near 0.3 s.
MAX_TEMPLATE_TOKENS = 10_000


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["+", "-", "*", "/", "//", "%", "**"])
    intercepted_unops = frozenset(["-", "+"])
    budget: RenderBudget

    def _parse(self, source, name, filename):
        """Parse as Jinja does, then route what no sandbox hook sees through the
        budget: loop iterables, `~`, literal output, list/tuple/dict literals,
        comparisons and include names."""
        _check_nesting(self._tokenize(source, name, filename), name, filename)
        return _Charged().visit(super()._parse(source, name, filename))

    # --- what the generated code calls --------------------------------------------

    def bw_finalize(self, value):  # Jinja calls it on every {{ ... }} before str()
        budget = self.budget
        budget.charge()
        if not isinstance(value, str):
            budget.require(budget.text_size(value), "this output")
            value = str(value)
        return budget.produced(value)

    # --- sandbox hooks ---------------------------------------------------------------

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's signature)
        budget = __self.budget
        budget.charge()
        guard_method(budget, __obj, args, kwargs)
        is_macro = isinstance(__obj, Macro)
        if is_macro:
            budget.charge(MACRO_CALL_COST)  # a macro call costs what ~20 operations do
            if budget.depth >= MAX_CALL_DEPTH:
                raise RenderLimit(f"macros nested more than {MAX_CALL_DEPTH} calls deep")
            budget.depth += 1
        try:
            result = super().call(__context, __obj, *args, **kwargs)
        finally:
            if is_macro:
                budget.depth -= 1
        return budget.produced(result)

    def getattr(self, obj, attribute):
        self.budget.charge()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        self.budget.charge()
        return super().getitem(obj, argument)

    def call_unop(self, context, operator, arg):
        self.budget.charge()
        return super().call_unop(context, operator, arg)

    def call_binop(self, context, operator, left, right):
        budget = self.budget
        budget.charge()
        _check_binop(budget, operator, left, right)
        return budget.produced(super().call_binop(context, operator, left, right))


def _check_nesting(stream, name, filename) -> None:
    """Refuse templates of more than MAX_TEMPLATE_TOKENS tokens, and expressions
    nested deeper than MAX_NESTING (the lexer is iterative), before parsing."""
    depth, unary, chain, previous = 0, 0, 0, None
    for count, token in enumerate(stream, 1):
        if count > MAX_TEMPLATE_TOKENS:
            raise TemplateSyntaxError(
                f"the template has more than {MAX_TEMPLATE_TOKENS} tokens (tags, names, "
                "operators, literals, text); split it into smaller templates",
                token.lineno, name, filename)
        if token.type in _TAG_START:
            chain = 0
        elif token.type in _CHAINED or (token.type == "name" and token.value in _CHAINED_NAMES) \
                or (token.type in ("lparen", "lbracket") and previous in _CLOSING):
            chain += 1
            if chain > MAX_CHAIN:
                raise TemplateSyntaxError(
                    f"a tag chains more than {MAX_CHAIN} operators, filters and lookups",
                    token.lineno, name, filename)
        if token.type in _OPENING:
            depth += 1
        elif token.type in _CLOSING:
            depth = max(0, depth - 1)
        is_unary = (token.type == "name" and token.value == "not") or (
            token.type in _UNARY and previous not in ("name", "integer", "float", "string",
                                                       *_CLOSING))
        unary = unary + 1 if is_unary else 0
        if depth + unary > MAX_NESTING:
            raise TemplateSyntaxError(
                f"an expression is nested more than {MAX_NESTING} levels deep (brackets "
                "and unary operators)", token.lineno, name, filename)
        previous = token.type


def _check_binop(budget: RenderBudget, operator, left, right) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**" and ints and abs(left) > 1 and right > 0 \
            and left.bit_length() * right > MAX_POWER_BITS:
        raise RenderLimit(f"{left} ** {right} is too large a number")
    if operator == "*":
        if ints and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise RenderLimit("that product is too large a number")
        for sequence, times in ((left, right), (right, left)):
            if isinstance(sequence, (str, bytes)) and isinstance(times, int):
                budget.require(len(sequence) * max(times, 0), "repeating a sequence")
            elif isinstance(sequence, (list, tuple)) and isinstance(times, int) and times > 0:
                budget.require(budget.text_size(sequence) * times, "repeating a sequence")
    elif operator == "+" and isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
        budget.require(len(left) + len(right), "this +")
    elif operator == "+" and isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        budget.require(budget.text_size(left) + budget.text_size(right), "this +")
    elif operator == "%" and isinstance(left, str):
        check_printf(budget, left, right)


def _budget_call(name: str, value: nodes.Expr, lineno: int) -> nodes.Filter:
    """A direct call of internal filter `name` (pass_context: never folded at compile
    time; cheaper than a sandboxed call)."""
    return nodes.Filter(value, name, [], [], None, None).set_lineno(lineno)


@pass_context
def _iterate(context, iterable):
    charge = context.environment.budget.charge
    for item in iterable:
        charge()
        yield item


@pass_context
def _concat(context, parts):
    budget = context.environment.budget
    budget.charge()
    budget.require(sum(budget.text_size(p) for p in parts), "this ~")
    return budget.produced("".join(map(str, parts)))


@pass_context
def _produced(context, value):
    """Literal template text, and list, tuple or dict literals: counted and bounded
    like any value built (loops and macros repeat them)."""
    budget = context.environment.budget
    budget.charge()
    return budget.produced(value)


@pass_context
def _include(context, name):
    """Includes nest until the stack is MAX_STACK_FRAMES deep at most: a render that
    recursed until Python's own limit would spend seconds unwinding."""
    context.environment.budget.charge()
    frame, depth = sys._getframe(), 0
    while frame is not None and depth <= MAX_STACK_FRAMES:
        frame, depth = frame.f_back, depth + 1
    if depth > MAX_STACK_FRAMES:
        raise RenderLimit("includes nested too deep")
    return name


@pass_context
def _tick(context, value):
    """After a comparison (comparing large structures takes time)."""
    context.environment.budget.charge()
    return value


_INTERNAL_FILTERS = {"bw_iterate": _iterate, "bw_concat": _concat, "bw_data": _produced,
                     "bw_include": _include, "bw_build": _produced, "bw_tick": _tick}


class _Charged(NodeTransformer):
    def visit_For(self, node):
        node = self.generic_visit(node)
        node.iter = _budget_call("bw_iterate", node.iter, node.lineno)
        return node

    def visit_Concat(self, node):
        node = self.generic_visit(node)
        return _budget_call("bw_concat", nodes.Tuple(node.nodes, "load"), node.lineno)

    def visit_Output(self, node):
        node = self.generic_visit(node)
        node.nodes = [_budget_call("bw_data", nodes.Const(n.data), n.lineno)
                      if isinstance(n, nodes.TemplateData) else n for n in node.nodes]
        return node

    def _built(self, node):
        node = self.generic_visit(node)
        if getattr(node, "ctx", "load") != "load":
            return node
        return _budget_call("bw_build", node, node.lineno)

    visit_List = visit_Tuple = visit_Dict = _built

    def visit_Compare(self, node):
        return _budget_call("bw_tick", self.generic_visit(node), node.lineno)

    def visit_Include(self, node):
        node = self.generic_visit(node)
        node.template = _budget_call("bw_include", node.template, node.lineno)
        return node


def _charged_filter(env: _Sandbox, name: str, func):
    check = FILTER_CHECKS.get(name)
    skip = 0 if _PassArg.from_obj(func) is None else 1

    @functools.wraps(func)
    def charged(*args, **kwargs):
        budget = env.budget
        budget.charge()
        if check is not None and len(args) > skip:
            check(budget, *args[skip:], **kwargs)
        return budget.produced(func(*args, **kwargs))

    return charged


def _charged_test(env: _Sandbox, func):
    @functools.wraps(func)
    def charged(*args, **kwargs):
        env.budget.charge()
        return func(*args, **kwargs)

    return charged


def _json_default(value):
    if isinstance(value, Undefined):
        str(value)  # StrictUndefined raises UndefinedError, naming the variable
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value, indent: int | None = None) -> str:
    """Plain JSON: Jinja's own tojson escapes <, > and & for HTML, which config
    files do not want."""
    return json.dumps(value, indent=indent, ensure_ascii=False, default=_json_default)


class _CompiledTemplates(BytecodeCache):
    """Compiled templates shared by every render of the process, by source
    checksum (the newest COMPILED_TEMPLATES): compiling a large template costs
    more than rendering it, and a preview would pay it on every request."""

    def __init__(self, size: int):
        self.size = size
        self.entries: OrderedDict[str, bytes] = OrderedDict()
        self.lock = threading.Lock()

    def load_bytecode(self, bucket):
        with self.lock:
            code = self.entries.get(bucket.key + bucket.checksum)
            if code is not None:
                self.entries.move_to_end(bucket.key + bucket.checksum)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket):
        code = bucket.bytecode_to_string()
        with self.lock:
            self.entries[bucket.key + bucket.checksum] = code
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)


COMPILED_TEMPLATES = 500
_compiled = _CompiledTemplates(COMPILED_TEMPLATES)
# A forked render (configlang.isolated) must not inherit the lock held by a thread.
os.register_at_fork(after_in_child=lambda: setattr(_compiled, "lock", threading.Lock()))


def template_environment(sources: dict[str, str], *, budget: RenderBudget) -> _Sandbox:
    """A fresh sandbox for one render; `sources` maps path -> template text."""
    env = _Sandbox(
        loader=FunctionLoader(
            lambda name: (sources[name], name, lambda: True) if name in sources else None
        ),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        optimized=False,
        bytecode_cache=_compiled,
    )
    env.budget = budget
    env.finalize = env.bw_finalize
    env.filters["tojson"] = _tojson
    # Only reviewed builtins (configlang.reviewed): a newer Jinja's additions are dropped.
    env.globals = {k: v for k, v in env.globals.items() if k in REVIEWED_GLOBALS}
    env.filters = {name: _charged_filter(env, name, func) for name, func in env.filters.items()
                   if name in REVIEWED_FILTERS}
    env.filters.update(_INTERNAL_FILTERS)
    env.tests = {name: _charged_test(env, func) for name, func in env.tests.items()
                 if name in REVIEWED_TESTS}
    return env


__all__ = ["RenderBudget", "RenderLimit", "SecurityError", "template_environment"]
