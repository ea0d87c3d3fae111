"""Hostile input meets bounds: template loops, huge numbers, remote schema refs, odd YAML."""

import http.server
import time

import pytest

from configlang.rendering import render_source, schema_problems
from configlang.yamlconfig import load_config
from tests.configlang.test_rendering import LIMITS, make_source, only_problem
from tests.ports import serve_in_thread


def _render(template: str, **limits):
    return render_source(make_source(config="items: [1, 2, 3]\n",
                                     templates={"a.conf": template}, **limits))


def test_nested_loops_stop_at_the_iteration_budget_quickly():
    started = time.monotonic()
    rendered = _render("{% for i in range(100000) %}{% for j in range(100000) %}"
                       "{% endfor %}{% endfor %}", max_template_iterations=10_000)
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.line) == ("render_limit", "a.conf", 1)
    assert "10000 operations" in problem.message
    assert time.monotonic() - started < 5


def test_the_budget_is_shared_by_every_template_of_a_render():
    source = make_source(templates={f"{n}.conf": "{% for i in range(300) %}.{% endfor %}"
                                    for n in "ab"}, max_template_iterations=1000)
    rendered = render_source(source)
    assert [p.file for p in rendered.problems] == ["b.conf"]


def test_loops_within_the_budget_keep_loop_variables():
    rendered = _render("{% for i in items %}{{ loop.index }}/{{ loop.length }} {% endfor %}")
    assert rendered.files == [{"path": "a.conf", "content": "1/3 2/3 3/3 "}]


@pytest.mark.parametrize("expression", ["2 ** 1000000", "(2 ** 64) ** 10000"])
def test_huge_powers_are_refused(expression):
    problem = only_problem(_render("{{ " + expression + " }}"))
    assert problem.code == "render_limit"


@pytest.mark.parametrize("expression", ["'a' * 1000000000", "[1] * 1000000000"])
def test_huge_repetitions_are_refused(expression):
    problem = only_problem(_render("{{ " + expression + " }}"))
    assert problem.code == "render_limit"


def test_ordinary_arithmetic_still_works():
    rendered = _render("{{ 2 ** 10 }} {{ 'ab' * 3 }} {{ 6 * 7 }}")
    assert rendered.files[0]["content"] == "1024 ababab 42"


@pytest.mark.parametrize("text", ["a: !!int abc\n", "a: !!float abc\n", "a: !!timestamp abc\n"])
def test_explicit_tags_that_do_not_convert_are_syntax_problems(text):
    config, [problem] = load_config(text, limits=LIMITS)
    assert (config, problem.code, problem.file) == ({}, "yaml_syntax", "config")


def test_nul_characters_in_config_values_are_refused():
    _, [problem] = load_config('a:\n  b: "x\\0y"\n', limits=LIMITS)
    assert (problem.code, problem.key) == ("yaml_value_type", "a.b")


def test_a_rendered_file_holding_nul_is_refused():
    problem = only_problem(_render('{{ "x\\x00y" }}'))
    assert (problem.code, problem.file) == ("file_binary", "a.conf")


@pytest.fixture
def http_server():
    """A local server that counts the requests it gets."""
    hits = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b'{"type": "integer"}')

        def log_message(self, *args):
            pass

    server = serve_in_thread(Handler)
    yield f"http://127.0.0.1:{server.server_port}", hits
    server.shutdown()


def test_a_remote_schema_ref_is_never_fetched(http_server):
    base, hits = http_server
    [problem] = schema_problems({"$ref": f"{base}/s.json"}, {"a": 1})
    assert problem.code == "schema_invalid"
    assert hits == []


@pytest.mark.parametrize("schema", [{"$ref": "#/$defs/nope"}, {"$ref": "#"}])
def test_broken_schema_refs_are_schema_problems(schema):
    [problem] = schema_problems(schema, {"a": 1})
    assert problem.code == "schema_invalid"


def test_local_refs_and_metaschema_refs_resolve():
    schema = {"properties": {"port": {"$ref": "#/$defs/port"}},
              "$defs": {"port": {"type": "integer"}}}
    assert [p.key for p in schema_problems(schema, {"port": "x"})] == ["port"]
    metaschema = {"$ref": "https://json-schema.org/draft/2020-12/schema"}
    assert schema_problems(metaschema, {"type": "object"}) == []
