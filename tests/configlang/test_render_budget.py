"""Hostile templates meet the render budget: whatever a template does, the render
ends with one `render_limit` problem naming the template and line, within a small
wall time and without growing the process. Rendered with the production limits."""

import resource
import time

import pytest

from configlang.budget import RenderBudget, RenderLimit, estimate_size
from configlang.rendering import render_source
from tests.configlang.test_rendering import make_source

PRODUCTION = {"max_config_bytes": 256 * 1024, "max_config_depth": 32,
              "max_config_nodes": 100_000, "max_file_bytes": 1024 * 1024,
              "max_snapshot_bytes": 8 * 1024 * 1024, "max_files": 500,
              "max_template_iterations": 1_000_000}
SECONDS = 2.0  # the render's deadline in these tests
WALL = 4.0  # what a test allows for the whole render
GROWTH_KB = 200 * 1024  # peak resident memory may grow by this much at most

CONFIG = "name: shop\nitems: [1, 2, 3]\nbig: 1099511627776\nword: abc\n"

HOSTILE = {
    # one call, a huge result
    "center filter": "{{ 'x'|center(2**40) }}",
    "center literal": "{{ 'x'|center(1099511627776) }}",
    "center of a config value": "{{ name|center(big) }}",
    "center method": "{{ 'x'.center(10**9) }}",
    "ljust method": "{{ 'x'.ljust(10**9) }}",
    "rjust method": "{{ 'x'.rjust(10**9, '-') }}",
    "zfill method": "{{ '1'.zfill(10**9) }}",
    "expandtabs": "{{ ('\\t' * 1000).expandtabs(10**6) }}",
    "indent width": "{{ ('a\\n' * 1000)|indent(10**6) }}",
    "indent string": "{{ ('a\\n' * 100000)|indent('x' * 100) }}",
    "replace filter": "{{ ('a' * 100000)|replace('a', 'b' * 1000) }}",
    "replace empty old": "{{ ('a' * 100000)|replace('', 'b' * 100) }}",
    "replace method": "{{ ('a' * 100000).replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
    "format width": "{{ '%0999999999d'|format(1) }}",
    "format star": "{{ '%*s'|format(1000000000, 'x') }}",
    "percent star": "{{ '%*s' % (1000000000, 'x') }}",
    "percent precision": "{{ '%.999999999f' % 1.5 }}",
    "str.format width": "{{ '{:>999999999}'.format(1) }}",
    "str.format nested": "{{ '{:>{}}'.format(1, 10**9) }}",
    "format_map": "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
    "join": "{% set s = 'x' * 500000 %}{{ [s, s, s, s]|join(s) }}",
    "join method": "{% set s = 'x' * 500000 %}{{ s.join([s, s, s]) }}",
    "wordwrap": "{{ ('a ' * 400000)|wordwrap(1, wrapstring='x' * 100) }}",
    "urlize target": "{{ ('a.com ' * 10000)|urlize(target='t' * 10000) }}",
    "tojson indent": "{{ items|tojson(indent=10**9) }}",
    "truncate": "{{ ('x' * 10**9)|truncate(5) }}",
    "batch": "{{ items|batch(10**9, 'x')|list }}",
    "slice": "{{ items|slice(10**9)|list }}",
    "to_bytes": "{{ (1).to_bytes(10**9, 'big') }}",
    "translate": "{{ ('a' * 10000).translate({97: 'x' * 10000}) }}",
    "sum of lists": "{{ ([[1] * 100000] * 100)|sum(start=[]) }}",
    # operators
    "repeat string": "{{ 'x' * 10**9 }}",
    "repeat list": "{{ [1, 2] * 10**9 }}",
    "repeat negative first": "{{ 10**9 * 'abc' }}",
    "concat doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
    "plus doubling": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
                     "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s|length }}",
    "list doubling": "{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                     "{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l|length }}",
    "nested list bomb": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}"
                        "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}",
    "nested list bomb as string": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}"
                                  "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l|string }}",
    "nested dict bomb as json": "{% set ns = namespace(d={}) %}{% for i in range(60) %}"
                                "{% set ns.d = {'a': ns.d, 'b': ns.d} %}{% endfor %}"
                                "{{ ns.d|tojson }}",
    "namespace bomb": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}"
                      "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns }}",
    "tuple bomb hashed": "{% set ns = namespace(t=(1,)) %}{% for i in range(60) %}"
                         "{% set ns.t = (ns.t, ns.t) %}{% endfor %}{{ {ns.t: 1} }}",
    "comparing two bombs": "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}"
                           "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}"
                           "{% endfor %}{{ ns.a == ns.b }}",
    "repeating a bomb": "{% set ns = namespace(a=[1]) %}{% for i in range(15) %}"
                        "{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                        "{% set b = [ns.a] * 1000 %}{{ b == b[:] }}",
    "batch filled with a bomb": "{% set ns = namespace(a=[1]) %}{% for i in range(15) %}"
                                "{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                                "{{ items|batch(100000, ns.a)|list|length }}",
    "fromkeys of a bomb": "{% set ns = namespace(a=[1]) %}{% for i in range(15) %}"
                          "{% set ns.a = [ns.a, ns.a] %}{% endfor %}"
                          "{{ {}.fromkeys(range(100000), ns.a)|length }}",
    "many comparisons": "{% set a = range(100000)|list %}{% set b = range(100000)|list %}"
                        "{% for i in range(100000) %}{% if a == b %}{% endif %}{% endfor %}",
    "huge power": "{{ 2 ** (10 ** 8) }}",
    "power of a power": "{{ (2 ** 64) ** 10000 }}",
    "squaring": "{% set ns = namespace(n=3) %}{% for i in range(64) %}"
                "{% set ns.n = ns.n * ns.n %}{% endfor %}{{ ns.n > 0 }}",
    "concat of a big int": "{{ (2 ** 99999) ~ (2 ** 99999) }}",
    "percent of a dag": "{% set ns = namespace(l=[1]) %}{% for i in range(60) %}"
                        "{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ '%s' % (ns.l,) }}",
    # time: loops, recursion, fan-out
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}"
                    "{% endfor %}{% endfor %}",
    "loop over a string of a billion": "{% for c in 'x' * 10**9 %}{% endfor %}",
    "recursive macro fan-out": "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}"
                               "{% endif %}{% endmacro %}{{ m(40) }}",
    "recursive macro fan-out of ten": "{% macro m(n) %}{% for i in range(10) %}{{ m(n - 1) }}"
                                      "{% endfor %}{% endmacro %}{{ m(12) }}",
    "deep recursion": "{% macro m(n) %}{{ m(n + 1) }}{% endmacro %}{{ m(0) }}",
    "deep recursion without output": "{% macro m(n) %}{% set x = m(n + 1) %}{% endmacro %}"
                                     "{{ m(0) }}",
    "call block recursion": "{% macro m() %}{{ caller() }}{% endmacro %}"
                            "{% macro r(n) %}{% call m() %}{{ r(n + 1) }}{% endcall %}"
                            "{% endmacro %}{{ r(0) }}",
    "recursive loop": "{% set t = [[[[]]]] * 10 %}{% for x in [t] * 10 recursive %}"
                      "{{ loop(t) }}{% endfor %}",
    "set block growth": "{% set ns = namespace(s='') %}{% for i in range(100000) %}"
                        "{% set ns.s %}{{ ns.s }}{{ ns.s }}x{% endset %}{% endfor %}",
    "literal text in loops": "{% set x %}{% for i in range(100000) %}{% for j in range(100) %}"
                             + "y" * 1000 + "{% endfor %}{% endfor %}{% endset %}",
    "macro output discarded": "{% macro m() %}{% for i in range(100000) %}" + "z" * 1000
                              + "{% endfor %}{% endmacro %}{% for i in range(100) %}"
                              "{% set x = m() %}{% endfor %}",
    "filter block": "{% filter upper %}{% for i in range(100000) %}" + "q" * 1000
                    + "{% endfor %}{% endfilter %}",
    "map over range": "{{ range(100000)|map('center', 100000)|list|length }}",
    "sort a huge list": "{{ (range(100000)|list * 100)|sort|length }}",
}
RECURSIVE_INCLUDE = {"a.conf": "{% include 'a.conf' %}{% include 'a.conf' %}"}


def _peak_kb() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _limited(templates: dict, config: str = CONFIG):
    before = _peak_kb()
    started = time.monotonic()
    rendered = render_source(make_source(config=config, templates=templates, **PRODUCTION),
                             seconds=SECONDS)
    elapsed = time.monotonic() - started
    assert elapsed < WALL, f"took {elapsed:.1f} s"
    assert _peak_kb() - before < GROWTH_KB, "the render grew the process"
    return rendered


@pytest.mark.slow
@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_template_ends_in_render_limit_quickly(template):
    rendered = _limited({"a.conf": "first line\n" + template})
    assert [p.code for p in rendered.problems] == ["render_limit"], rendered.problems
    problem = rendered.problems[0]
    assert (problem.file, problem.line) == ("a.conf", 2)
    assert problem.message.startswith("a.conf:2: ")
    assert rendered.files == []


@pytest.mark.parametrize("template", list(HOSTILE.values())[:20], ids=list(HOSTILE)[:20])
def test_a_hostile_macro_in_an_imported_template_names_that_template(template):
    lib = "{% macro bad() %}\n" + template + "\n{% endmacro %}"
    user = "{% import 'lib.j2' as l with context %}{{ l.bad() }}"
    rendered = _limited({"lib.j2": lib, "z.conf": user})
    problem = next(p for p in rendered.problems if p.code == "render_limit")
    assert (problem.file, problem.line) == ("lib.j2", 2)


def test_recursive_includes_with_fan_out_end_in_render_limit():
    rendered = _limited(RECURSIVE_INCLUDE)
    assert [p.code for p in rendered.problems] == ["render_limit"]
    assert rendered.problems[0].file == "a.conf"


def test_one_render_limit_stops_the_render_of_later_templates():
    rendered = _limited({"a.conf": HOSTILE["recursive macro fan-out"],
                         "b.conf": "fine", "c.conf": HOSTILE["nested loops"]})
    assert [(p.code, p.file) for p in rendered.problems] == [("render_limit", "a.conf")]


def test_the_deadline_stops_a_render_that_stays_within_the_operations():
    source = make_source(config=CONFIG, templates={"a.conf": HOSTILE["nested loops"]},
                         **{**PRODUCTION, "max_template_iterations": 10**9})
    started = time.monotonic()
    problem = render_source(source, seconds=0.5).problems[0]
    assert time.monotonic() - started < 2
    assert (problem.code, problem.line) == ("render_limit", 1)
    assert "longer than 0.5 seconds" in problem.message


@pytest.mark.parametrize("expression", [
    "x.__class__", "x.__class__.__mro__", "''.__class__.__mro__[1].__subclasses__()",
    "range.__globals__", "namespace.__init__.__globals__", "cycler.__init__.__globals__",
    "joiner.__init__", "self.__init__", "items.__class__", "lipsum(10**6)",
    "(1).to_bytes.__self__.__class__", "''.format.__self__.__class__",
])
def test_escapes_stay_refused(expression):
    rendered = _limited({"a.conf": "{{ " + expression + " }}"}, config="x: 1\nitems: [1]\n")
    assert rendered.files == []
    assert rendered.problems[0].code in ("template_security", "template_undefined",
                                         "template_error")


ORDINARY = {
    "{{ name|center(10) }}": "   shop   ",
    "{{ '%5.1f|%-4s|%03d' % (1.25, 'a', 7) }}": "  1.2|a   |007",
    "{{ '{:>6}|{:.2f}'.format('ab', 3.14159) }}": "    ab|3.14",
    "{{ '%(a)s-%(b)d'|format(a='x', b=2) }}": "x-2",
    "{{ items|join(', ') }} {{ items|tojson(indent=2)|length }}": "1, 2, 3 17",
    "{{ ('a\\nb')|indent(2, first=True) }}": "  a\n  b",
    "{{ 'abc'|replace('b', 'BB') }} {{ 'aaa'.replace('a', 'b', 2) }}": "aBBc bba",
    "{{ 'x' ~ 1 ~ items }}": "x1[1, 2, 3]",
    "{{ (items + [4])|sum }} {{ 2 ** 64 }} {{ 10 * 'ab'|length }}": "10 18446744073709551616 20",
    "{% macro m(n) %}{% if n %}{{ n }}{{ m(n - 1) }}{% endif %}{% endmacro %}{{ m(5) }}":
        "54321",
    "{% for i in range(3) %}{% for j in items %}{{ loop.index }}{% endfor %}{% endfor %}":
        "123123123",
    "{{ 'long words here'|wordwrap(5) }}": "long\nwords\nhere",
    "{{ big|filesizeformat(true) }} {{ ('x' * 300)|truncate(10) }}": "1.0 TiB xxxxxxx...",
    "{{ {'b': 1, 'a': 2}|dictsort|list }}": "[('a', 2), ('b', 1)]",
}


@pytest.mark.parametrize("template, expected", ORDINARY.items())
def test_ordinary_templates_render_as_before(template, expected):
    rendered = _limited({"a.conf": template})
    assert rendered.problems == []
    assert rendered.files[0]["content"] == expected


def test_a_large_but_legal_render_fits_the_budget():
    config = "hosts:\n" + "".join(f"  - {{name: h{i}, port: {8000 + i}}}\n" for i in range(1000))
    template = ("{% for h in hosts %}server {{ h.name }}:{{ h.port }};"
                "{{ '%-10s' % h.name }}\n{% endfor %}")
    rendered = _limited({"a.conf": template}, config=config)
    assert rendered.problems == []
    assert rendered.files[0]["content"].count("\n") == 1000


def test_estimate_size_stops_at_its_cap_on_a_shared_structure():
    nested = [1]
    for _ in range(200):
        nested = [nested, nested]
    started = time.monotonic()
    assert estimate_size(nested, 10_000) > 10_000
    assert time.monotonic() - started < 0.5


def test_the_budget_counts_operations_and_bytes():
    budget = RenderBudget(operations=3, value_bytes=10, total_bytes=15)
    budget.charge(3)
    with pytest.raises(RenderLimit, match="3 operations"):
        budget.charge()
    budget.produced("x" * 10)
    with pytest.raises(RenderLimit, match="15 bytes"):
        budget.produced("x" * 10)
    with pytest.raises(RenderLimit, match="limit is 10"):
        budget.require(11, "this")


def test_a_template_is_compiled_once_per_process():
    template = "{% for i in range(3) %}{{ i }}{% endfor %}" * 100 + "{{ name }}"
    first = time.monotonic()
    _limited({"a.conf": template})
    first = time.monotonic() - first
    again = time.monotonic()
    rendered = _limited({"a.conf": template})
    again = time.monotonic() - again
    assert rendered.problems == [] and rendered.files[0]["content"].endswith("shop")
    assert again < first / 2
