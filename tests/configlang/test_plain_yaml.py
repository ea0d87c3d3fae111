"""The plain YAML path (configlang.yamlconfig._plain_value): a value built straight
from libyaml's events must be exactly what the bounded composer builds, and
anything it does not take goes to the composer, which reports the problem."""

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from configlang import yamlconfig
from configlang.yamlconfig import _NOT_PLAIN, _composed, _plain_value, load_config, load_yaml

LIMITS = {"max_config_bytes": 1_000_000, "max_config_depth": 8, "max_config_nodes": 1000}


def composed(text: str, limits: dict = LIMITS):
    return _composed(text, limits=limits, file="config")


def plain(text: str, limits: dict = LIMITS):
    return _plain_value(text, max_depth=limits["max_config_depth"],
                        max_nodes=limits["max_config_nodes"])


@pytest.fixture
def composer_refused(monkeypatch):
    """The composer fails the test if it is asked: the plain path answered alone."""
    class Refused(yamlconfig._LibyamlLoader):
        def __init__(self, stream):
            raise AssertionError("the composer was asked")
    monkeypatch.setattr(yamlconfig, "LOADER", Refused)


def test_a_plain_config_never_reaches_the_composer(composer_refused):
    text = ("name: shop\nport: 8080\nratio: 0.5\nflags: [true, false, ~, '']\n"
            "nested:\n  - {a: 1, b: \"two\"}\n  - |\n    block\n  - 0x1f\n")
    assert load_config(text, limits=LIMITS) == (
        {"name": "shop", "port": 8080, "ratio": 0.5, "flags": [True, False, None, ""],
         "nested": [{"a": 1, "b": "two"}, "block\n", 31]}, [])


PLAIN_TEXTS = [
    "", "---\n", "a: 1\n", "- 1\n- two\n", "just a string\n", "42\n", "a: 012\n",
    "a: 0o17\n", "a: 1_000\n", "a: -3\n", "a: +3\n", "a: 0b101\n", "a: 1:30\n",
    "a: 1.5e3\n", "a: .5\n", "a: yes\nb: No\nc: on\nd: OFF\n", "a: null\nb: Null\nc: ~\nd:\n",
    "a: 2024-01-02\n", "'1': x\n\"true\": y\n", "a: !!str 1\n", "a: '\\0'\n", "a: \"x\\0y\"\n",
    "a: &x 1\nb: *x\n", "<<: {a: 1}\nb: 2\n", "a: =\n", "a: 1\na: 2\n", "a: 1\n'a': 2\n",
    "1: a\n", "? [a]\n: b\n", "a: .nan\n", "a: -.inf\n", "--- 1\n--- 2\n", "a: [\n",
    "a: b: c\n", "[[[[[[[[[1]]]]]]]]]\n", "[[[[[[[[1]]]]]]]]\n", "a: ! x\n", "a: !foo x\n",
    "a: 1" + "0" * 5000 + "\n", "%YAML 1.1\n--- a\n", "a: !!binary aGVsbG8=\n",
    "a: !!set {x, y}\n", "\ufeffa: 1\n", "a: b\x07\n", "a:\n  - x\n  -\n  - y\n",
]


@pytest.mark.parametrize("text", PLAIN_TEXTS)
def test_the_plain_path_builds_what_the_composer_builds_or_leaves_it(text):
    value = plain(text)
    if value is not _NOT_PLAIN:
        assert composed(text) == (value, [])
        assert repr(composed(text)[0]) == repr(value)  # 1 and True, 1 and 1.0 differ


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n", "<<: {a: 1}\nb: 2\n", "a: !!str 1\n", "a: ! x\n", "a: 1\na: 2\n",
    "a: 1\n'a': 2\n", "1: a\n", "? [a]\n: b\n", "a: .nan\n", "a: \"x\\0y\"\n", "--- 1\n--- 2\n",
    "a: [\n", "[[[[[[[[[1]]]]]]]]]\n", "a: =\n", "a: 1" + "0" * 5000 + "\n", "a: *x\n",
    "[*x]\n",
])
def test_anchors_tags_merge_keys_and_broken_bounds_are_left_to_the_composer(text):
    assert plain(text) is _NOT_PLAIN


def test_the_node_bound_counts_values_as_the_composed_check_does():
    text = "[" + ", ".join(["1"] * 9) + "]\n"  # ten values with the list
    assert plain(text, {**LIMITS, "max_config_nodes": 10}) == [1] * 9
    assert plain(text, {**LIMITS, "max_config_nodes": 9}) is _NOT_PLAIN
    _, [problem] = load_yaml(text, limits={**LIMITS, "max_config_nodes": 9})
    assert problem.code == "yaml_too_large"


def test_the_depth_bound_is_the_composers_with_its_line():
    text = "ok: 1\ndeep: [[[[[[[[1]]]]]]]]\n"  # 9 levels below the root
    assert plain(text) is _NOT_PLAIN
    assert plain(text, {**LIMITS, "max_config_depth": 9}) == {"ok": 1, "deep": [[[[[[[[1]]]]]]]]}
    _, [problem] = load_yaml(text, limits=LIMITS)
    assert (problem.code, problem.line) == ("yaml_too_deep", 2)


def test_a_million_open_brackets_are_refused_without_recursion():
    _, [problem] = load_yaml("[" * 1_000_000, limits={**LIMITS, "max_config_bytes": 2_000_000})
    assert (problem.code, problem.line) == ("yaml_too_deep", 1)


texts = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=12)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(
    allow_nan=False, allow_infinity=False) | texts
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        texts, children, max_size=4),
    max_leaves=30)


@given(value=json_values, flow=st.sampled_from([None, True, False]))
def test_any_value_yaml_dumps_loads_back_the_same_on_the_plain_path(value, flow):
    text = yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True)
    got = plain(text, {**LIMITS, "max_config_depth": 32})
    assert got is not _NOT_PLAIN, text
    # Not always `value`: PyYAML folds some line breaks (U+0085) when it dumps.
    assert composed(text, {**LIMITS, "max_config_depth": 32}) == (got, [])
    assert repr(composed(text, {**LIMITS, "max_config_depth": 32})[0]) == repr(got)


TOKENS = ["a", "b", "1", "0x1", "1.5", ".inf", "true", "~", "null", "<<", "=", ":", ": ", " ",
          "  ", "\n", "- ", "[", "]", "{", "}", ", ", "&x ", "*x", "!!str ", "!x ", "? ",
          "'q'", '"\\0"', '"\\t"', "#c", "|\n  t\n", "---\n", "...\n", "%YAML 1.1\n", "\t"]


@given(parts=st.lists(st.sampled_from(TOKENS), max_size=24))
def test_any_text_the_plain_path_takes_the_composer_takes_alike(parts):
    text = "".join(parts)
    value = plain(text)
    if value is not _NOT_PLAIN:
        assert composed(text) == (value, []), text
        assert repr(composed(text)[0]) == repr(value), text
