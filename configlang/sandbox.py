"""The Jinja2 sandbox file templates render in.

Immutable (a template cannot change the config the next one sees), strict about
undefined names, and bounded: every for-loop draws on one iteration budget per
render, and `*` / `**` refuse results that would be huge.
"""

import json

from jinja2 import FunctionLoader, StrictUndefined, Undefined, nodes
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

_BUDGET_NAME = "__bellwether_loop_budget"
MAX_POWER_BITS = 100_000
MAX_REPEAT_LENGTH = 10 * 1024 * 1024


class _IterationBudget:
    def __init__(self, limit: int):
        self.limit = limit
        self.left = limit

    def __call__(self, iterable):
        for item in iterable:
            self.left -= 1
            if self.left < 0:
                raise SecurityError(
                    f"template loops ran more than {self.limit} iterations in this render"
                )
            yield item


class _Sandbox(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset(["*", "**"])

    def _parse(self, source, name, filename):
        """Parse as Jinja does, then make `{% for x in items %}` iterate over
        `budget(items)`, so every loop of the render draws on one budget."""
        tree = super()._parse(source, name, filename)
        for loop in tree.find_all(nodes.For):
            loop.iter = nodes.Call(
                nodes.Name(_BUDGET_NAME, "load"), [loop.iter], [], None, None
            ).set_lineno(loop.lineno)
        return tree

    def call_binop(self, context, operator, left, right):
        if (operator == "**" and isinstance(left, int) and isinstance(right, int)
                and abs(left) > 1 and right > 0 and left.bit_length() * right > MAX_POWER_BITS):
            raise SecurityError(f"{left} ** {right} is too large a number")
        if operator == "*":
            for sequence, times in ((left, right), (right, left)):
                if (isinstance(sequence, (str, list, tuple)) and isinstance(times, int)
                        and len(sequence) * times > MAX_REPEAT_LENGTH):
                    raise SecurityError("repeating a sequence that often is too large")
        return super().call_binop(context, operator, left, right)


def _json_default(value):
    if isinstance(value, Undefined):
        str(value)  # StrictUndefined raises UndefinedError, naming the variable
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _tojson(value, indent: int | None = None) -> str:
    """Plain JSON: Jinja's own tojson escapes <, > and & for HTML, which config
    files do not want."""
    return json.dumps(value, indent=indent, ensure_ascii=False, default=_json_default)


def template_environment(sources: dict[str, str], *, iteration_budget: int) -> _Sandbox:
    """A fresh sandbox for one render; `sources` maps path -> template text."""
    env = _Sandbox(
        loader=FunctionLoader(
            lambda name: (sources[name], name, lambda: True) if name in sources else None
        ),
        undefined=StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["tojson"] = _tojson
    env.globals[_BUDGET_NAME] = _IterationBudget(iteration_budget)
    return env
