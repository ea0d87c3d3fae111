"""The backstop: a render in a child process limited in memory and time."""

import time
from unittest import mock

from configlang import isolated, rendering
from configlang.isolated import render_isolated
from tests.configlang.test_render_budget import PRODUCTION
from tests.configlang.test_rendering import make_source


def _source(template: str):
    return make_source(config="name: shop\n", templates={"a.conf": template}, **PRODUCTION)


def test_an_isolated_render_answers_what_an_inline_one_does():
    source = _source("{{ name }} {% for i in range(3) %}{{ i }}{% endfor %}")
    rendered = render_isolated(source, seconds=5, memory_bytes=256 << 20)
    assert rendered.files == rendering.render_source(source).files
    assert rendered.problems == []


def test_the_budget_still_names_template_and_line_in_the_child():
    rendered = render_isolated(_source("x\n{{ 'x'|center(2**40) }}"), seconds=5,
                               memory_bytes=256 << 20)
    [problem] = rendered.problems
    assert (problem.code, problem.file, problem.line) == ("render_limit", "a.conf", 2)


def _hog(source, seconds):
    """What a bug escaping the budget would do: allocate without end."""
    hoard = []
    while True:
        hoard.append(bytearray(64 << 20))


def _hang(source, seconds):
    while True:
        pass


def test_a_child_over_its_memory_limit_is_a_render_limit_not_a_dead_parent():
    with mock.patch.object(isolated, "render_source", _hog):
        rendered = render_isolated(_source("x"), seconds=5, memory_bytes=128 << 20)
    [problem] = rendered.problems
    assert problem.code == "render_limit"
    assert "memory" in problem.message


def test_a_child_that_never_answers_is_stopped():
    started = time.monotonic()
    with mock.patch.object(isolated, "render_source", _hang), \
            mock.patch.object(isolated, "GRACE_SECONDS", 1):
        rendered = render_isolated(_source("x"), seconds=1, memory_bytes=128 << 20)
    assert time.monotonic() - started < 5
    [problem] = rendered.problems
    assert problem.code == "render_limit"


def test_where_no_child_can_be_started_the_render_runs_here():
    with mock.patch.object(isolated.os, "fork", side_effect=OSError("no")):
        rendered = render_isolated(_source("{{ name }}"), seconds=5, memory_bytes=128 << 20)
    assert rendered.files == [{"path": "a.conf", "content": "shop"}]


def test_a_child_answering_something_else_than_a_render_is_a_failed_render():
    with mock.patch.object(isolated, "render_source", lambda *a, **k: None):
        rendered = render_isolated(make_source(), seconds=2, memory_bytes=256 << 20)
    assert [p.code for p in rendered.problems] == ["render_failed"]
