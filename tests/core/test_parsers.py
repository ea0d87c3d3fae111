"""The body parsers (apps.core.parsers) refuse text no server may store, wherever in
the body it is: every bad string as a value, in a list, as an object's value or
key, however deep, a 400 naming where it is (YAML bodies: its loader's refusal,
naming the key or the line). Every JSON and
YAML route parses through them; tests/api/test_hostile_input.py shows that each
route's fields are refused through them."""

import io

import pytest
from rest_framework.exceptions import ParseError, ValidationError

from apps.core.parsers import BoundedJSONParser, TextYAMLParser

# JSON text of strings no server may store: NUL, a lone high and a lone low
# surrogate (as escapes, the only way JSON carries them), NUL beside text.
BAD_STRINGS = ['"\\u0000"', '"\\ud800"', '"a\\udfffb"', '"name\\u0000x"']
# Where in a body a bad string may sit, and the field path the refusal names.
PLACES = {
    "value": ('{{"f": {bad}}}', "f"),
    "in a list": ('{{"f": ["ok", {bad}]}}', "f[1]"),
    "an object's value": ('{{"f": {{"k": {bad}}}}}', "f.k"),
    "deep": ('{{"f": [{{"a": [[{{"b": {bad}}}]]}}]}}', "f[0].a[0][0].b"),
}


def parse_json(text: str):
    return BoundedJSONParser().parse(io.BytesIO(text.encode()))


def refused_field(parse, text: str) -> str:
    return refusal(parse, text)[0]


def refusal(parse, text: str) -> tuple[str, str]:
    """(the field the 400 names, its message)."""
    with pytest.raises(ValidationError) as refused:
        parse(text)
    ((field, (message,)),) = refused.value.detail.items()
    return field, str(message)


@pytest.mark.parametrize("bad", BAD_STRINGS)
@pytest.mark.parametrize("place", PLACES)
def test_a_bad_string_anywhere_in_a_json_body_is_refused_naming_where(place, bad):
    template, field = PLACES[place]

    assert refused_field(parse_json, template.format(bad=bad)) == field


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_a_bad_string_as_a_key_is_refused_at_the_top_and_below(bad):
    shown = bad.strip('"').replace("\\u0000", "\\x00")

    assert refusal(parse_json, f'{{{bad}: 1}}') == (shown, f"the key {problem_of(bad)}")
    assert refusal(parse_json, f'{{"f": {{{bad}: "v"}}}}') == (
        f"f.{shown}", f"the key {problem_of(bad)}")


def problem_of(bad: str) -> str:
    return "contains a NUL character" if "0000" in bad else (
        "contains a lone surrogate (not valid Unicode)")


@pytest.mark.parametrize(("body", "where"), [('f:\n  k: "a\\0b"\n', "YAML body f.k:"),
                                             ('f: ["ok", "\\ud800"]\n', "YAML body:1:")])
def test_a_bad_string_in_a_yaml_body_is_refused_naming_where(body, where):
    with pytest.raises(ParseError) as refused:
        TextYAMLParser().parse(io.BytesIO(body.encode()))

    assert str(refused.value.detail).startswith(where), refused.value.detail


def test_storable_text_passes_as_it_is():
    body = '{"f": ["ok", {"k": "caf\\u00e9 \\ud83d\\ude00"}]}'

    assert parse_json(body) == {"f": ["ok", {"k": "café 😀"}]}
