"""Hostile templates of three classes (issue 12 item 7): C-level numeric work whose
cost grows with an operand (checked before it runs), builtins misused (a
`template_error` naming template and line, never an internal error), and
expressions nested or chained past what the parser and compiler recurse through
(`template_syntax` naming the line, before parsing)."""

import time

import pytest
from jinja2.defaults import DEFAULT_FILTERS, DEFAULT_NAMESPACE, DEFAULT_TESTS

from configlang import reviewed
from configlang.budget import RenderBudget
from configlang.rendering import render_source, template_syntax_problems
from configlang.sandbox import MAX_CHAIN, MAX_NESTING, template_environment
from tests.configlang.test_render_budget import CONFIG, PRODUCTION, SECONDS
from tests.configlang.test_rendering import make_source

FAST = 2.5  # seconds: what any of these renders may take (a loaded machine)


def _render(template: str):
    source = make_source(config=CONFIG, templates={"a.conf": "first line\n" + template},
                         **PRODUCTION)
    started = time.monotonic()
    rendered = render_source(source, seconds=SECONDS)
    assert time.monotonic() - started < FAST, template
    return rendered


def _only(rendered, code: str, line: int | None = 2):
    assert [p.code for p in rendered.problems] == [code], rendered.problems
    assert (rendered.problems[0].file, rendered.problems[0].line) == ("a.conf", line)
    return rendered.problems[0]


NUMERIC = [
    "{{ 12345|round(-10**7) }}", "{{ 12345|round(-10**9) }}", "{{ 12345|round(10**9) }}",
    "{{ big|round(-101) }}", "{{ ('9' * 5000)|int }}", "{{ ('9' * 10**6)|float }}",
    "{{ ('1' * 5000)|int(base=2) }}", "{{ 'x'.encode('punycode') }}",
    "{{ ('é' * 10**5).encode('idna') }}", "{{ 'x'.encode('rot13') }}",
    "{{ 2 ** (10**8) }}", "{{ (-3) ** (10**7) }}", "{{ (2**60000) * (2**60000) }}",
    "{{ '%.9999999f' % 1.0 }}", "{{ '%.9999999f'|format(1e308) }}",
    "{{ '{:.9999999}'.format(1.0) }}", "{{ '{:9999999}'.format(1) }}",
    "{{ (1).to_bytes(10**9, 'big') }}",
]


@pytest.mark.parametrize("template", NUMERIC)
def test_numeric_work_growing_with_an_operand_is_refused_before_it_runs(template):
    _only(_render(template), "render_limit")


MISUSE = [
    "{{ 'x'|truncate(2) }}", "{{ 'x'|truncate(-1) }}", "{{ 'abcdef'|truncate(3, leeway=-5) }}",
    "{{ 1e999|int }}", "{{ -1e999 }}", "{{ none + 1 }}", "{{ 1 / 0 }}", "{{ 1 // 0 }}",
    "{{ 1 % 0 }}", "{{ 2.0 ** 10000 }}", "{{ (2 ** 50000)|float }}", "{{ 2 ** 20000 }}",
    "{{ 10 ** 400|filesizeformat }}", "{{ {}|first }}", "{{ []|last }}", "{{ 'a'|wordwrap(0) }}",
    "{{ 'x'|center('a') }}", "{{ [1, 'a']|sort }}", "{{ [1, 2]|sum(start='a') }}",
    "{{ 1|attr(1) }}", "{{ 'x'|indent(none) }}", "{{ none|length }}", "{{ 1|join }}",
    "{{ 1|list }}", "{{ 1|dictsort }}", "{{ 1|slice(0)|list }}", "{{ 'x'|round }}",
    "{{ 1|replace('a', 'b', 'c') }}", "{{ 'a'|format(1, 2) }}", "{{ [1]|map('nope')|list }}",
    "{{ [1]|select('nope')|list }}", "{{ 1|groupby('x') }}",
    "{{ {'a': 1}['b'] }}", "{{ [1][5] }}", "{{ (1).nope() }}", "{{ 'x'.center() }}",
    "{{ 'x'.format(**1) }}", "{{ '{0}'.format() }}", "{{ '%d' % 'x' }}", "{{ 1 is divisibleby 0 }}",
    "{{ range(1, 10, 0)|list }}", "{{ dict(1) }}", "{{ 'x' < 1 }}", "{{ 1|random }}",
    "{{ 'a'|xmlattr }}",
]


@pytest.mark.parametrize("template", MISUSE)
def test_misusing_a_builtin_is_a_template_error_naming_the_line(template):
    rendered = _render(template)
    assert rendered.files == []
    assert [p.code for p in rendered.problems] in (
        ["template_error"], ["template_undefined"], ["template_security"], ["render_limit"])
    problem = rendered.problems[0]
    assert (problem.file, problem.line) == ("a.conf", 2), problem
    assert "internal error" not in problem.message


def test_a_builtin_raising_what_no_one_expects_is_still_a_template_error():
    rendered = _render("{{ 'abc'|truncate(2) }}")  # Jinja asserts: AssertionError
    assert "AssertionError" in _only(rendered, "template_error").message


@pytest.mark.slow  # some 3,000 renders
def test_every_filter_with_every_hostile_argument_ends_in_a_problem_or_a_file():
    """No filter, whatever it is given, escapes as an exception or a long render."""
    values = ["'abc'", "12345", "1e308", "none", "[1, 2]", "{'a': 1}", "-7"]
    arguments = ["", "(none)", "(-1)", "(10**9)", "(-10**9)", "('x')", "([])", "(1e308)"]
    for name in sorted(reviewed.REVIEWED_FILTERS):
        lines = [f"{{{{ {v}|{name}{a} }}}}" for v in values for a in arguments]
        for line in lines:
            rendered = _render(line)
            assert rendered.files or rendered.problems
            assert all("internal error" not in p.message for p in rendered.problems)


@pytest.mark.slow  # some 900 renders
def test_every_test_with_hostile_arguments_ends_in_a_problem_or_a_file():
    for name in sorted(reviewed.REVIEWED_TESTS):
        if not name.isidentifier():
            continue
        for value in ("'abc'", "12345", "none", "[1]", "1e308"):
            for argument in ("", "(0)", "(none)", "('x')", "(10**9)"):
                rendered = _render(f"{{{{ {value} is {name}{argument} }}}}")
                assert rendered.files or rendered.problems


NESTED = {
    "parentheses": "{{ " + "(" * 100 + "1" + ")" * 100 + " }}",
    "brackets": "{{ " + "[" * 100 + "1" + "]" * 100 + " }}",
    "braces": "{{ " + "{'a': " * 100 + "1" + "}" * 100 + " }}",
    "not": "{{ " + "not " * 3000 + "1 }}",
    "unary minus": "{{ " + "-" * 3000 + "1 }}",
    "unary plus": "{{ " + "+" * 3000 + "1 }}",
    "minus with spaces": "{{ " + "- " * 3000 + "1 }}",
    "plus chain": "{{ 1" + " + 1" * 3000 + " }}",
    "filter chain": "{{ 'x'" + "|trim" * 3000 + " }}",
    "attribute chain": "{{ a" + ".b" * 3000 + " }}",
    "and chain": "{% if x" + " and x" * 3000 + " %}{% endif %}",
    "comparison chain": "{{ 1" + " < 2" * 3000 + " }}",
    "calls": "{{ f" + "()" * 3000 + " }}",
    "in a set": "{% set y = " + "(" * 200 + "1" + ")" * 200 + " %}",
}


@pytest.mark.parametrize("template", NESTED.values(), ids=NESTED.keys())
def test_deep_nesting_is_a_syntax_problem_naming_the_line(template):
    problems = template_syntax_problems([{"path": "a.conf", "source": "first\n" + template}])
    assert [(p.code, p.file, p.line) for p in problems] == [("template_syntax", "a.conf", 2)]
    _only(_render(template), "template_syntax")


def test_nesting_and_chains_within_the_limits_still_render():
    depth = MAX_NESTING - 1
    rendered = _render("{{ " + "(" * depth + "1" + ")" * depth + " }}"
                       "{{ 1" + " + 1" * MAX_CHAIN + " }}{{ - - 1 }}{{ not not 1 }}")
    assert rendered.problems == []
    assert rendered.files[0]["content"] == f"first line\n1{MAX_CHAIN + 1}1True"


def test_every_jinja_builtin_is_reviewed_or_removed():
    """A newer Jinja adding a filter, test or global fails here until it is reviewed."""
    assert set(DEFAULT_FILTERS) == set(reviewed.REVIEWED_FILTERS) | set(reviewed.REMOVED_FILTERS)
    assert set(DEFAULT_TESTS) == set(reviewed.REVIEWED_TESTS) | set(reviewed.REMOVED_TESTS)
    assert set(DEFAULT_NAMESPACE) == set(reviewed.REVIEWED_GLOBALS) | set(reviewed.REMOVED_GLOBALS)


def test_the_sandbox_offers_only_reviewed_builtins(monkeypatch):
    monkeypatch.setitem(DEFAULT_FILTERS, "unreviewed", lambda value: value)
    monkeypatch.setitem(DEFAULT_TESTS, "unreviewed", lambda value: True)
    env = template_environment({}, budget=RenderBudget(operations=10, value_bytes=10,
                                                       total_bytes=10))
    assert set(env.filters) - {n for n in env.filters if n.startswith("bw_")} \
        <= set(reviewed.REVIEWED_FILTERS)
    assert set(env.tests) <= set(reviewed.REVIEWED_TESTS)
    assert set(env.globals) <= set(reviewed.REVIEWED_GLOBALS)
    assert "lipsum" not in env.globals
