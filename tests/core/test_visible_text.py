"""Names, labels and file paths hold what a reader sees: one rule
(configlang.visible) for apps.core.text.name_problem and configlang's path_problem."""

import pytest

from apps.core.text import name_problem
from configlang.rendering import path_problem
from configlang.visible import invisible_problem

INVISIBLE = ["\u115f", "\u1160", "\u3164", "\uffa0", "\u00a0", "\u3000", "\u2007", "\u202f",
             "\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u034f", "\ufe0f",
             "\U000e0041", "\u180e", "\u202e", "\u2028", "\ue000", "\x01", "\x7f"]


@pytest.mark.parametrize("char", INVISIBLE, ids=lambda c: f"U+{ord(c):04X}")
def test_an_invisible_or_look_alike_character_is_refused_in_names_and_paths(char):
    assert invisible_problem(f"a{char}b")
    assert name_problem(f"web{char}1")
    assert path_problem(f"nginx/site{char}.conf")
    assert path_problem(f"ng{char}inx/site.conf")


@pytest.mark.parametrize("value", [" web", "web ", "\tweb", "web\n"])
def test_whitespace_at_either_end_is_refused(value):
    assert name_problem(value)
    assert path_problem(value)
    assert path_problem(f"{value}/site.conf")
    assert path_problem(f"conf/{value}")


@pytest.mark.parametrize("value", ["web 1", "nginx/site.conf", "café", "日本/設定.conf",
                                   "a-b_c.d", "Ünïcödé names"])
def test_visible_text_passes(value):
    assert invisible_problem(value) is None
    assert name_problem(value) is None
    assert path_problem(value.replace(" ", "_")) is None
