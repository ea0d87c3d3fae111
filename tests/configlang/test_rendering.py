"""Rendering and validating a snapshot's source, and the bounded YAML loader (no DB)."""

import hashlib
import json
import time

import pytest

from configlang import yamlconfig
from configlang.rendering import content_checksum, render_source
from configlang.yamlconfig import load_config, load_yaml

LIMITS = {
    "max_config_bytes": 4096,
    "max_config_depth": 8,
    "max_config_nodes": 1000,
    "max_file_bytes": 2048,
    "max_snapshot_bytes": 8192,
    "max_files": 10,
}


def make_source(config="name: shop\n", templates=None, fallback=None, schema=None, **limits):
    """A source dict shaped like apps.snapshots.selectors.render_source_for's."""
    return {
        "format": 1,
        "application": "shop",
        "environment": "prod",
        "config": config,
        "config_schema": schema,
        "templates": [{"path": p, "source": s} for p, s in (templates or {}).items()],
        "fallback_files": [{"path": p, "content": c} for p, c in (fallback or {}).items()],
        "limits": {**LIMITS, **limits},
    }


def only_problem(rendered):
    assert len(rendered.problems) == 1, rendered.problems
    return rendered.problems[0]


# --- the YAML loader ---------------------------------------------------------------


@pytest.fixture(autouse=True, params=["libyaml", "python"])
def loader(request, monkeypatch):
    """Every test here runs with both parsers: libyaml's (what load_yaml uses when
    PyYAML has it) and PyYAML's own; the bounds are the same."""
    if request.param == "python":
        monkeypatch.setattr(yamlconfig, "LOADER", yamlconfig._PythonLoader)
    else:
        assert yamlconfig.LOADER is yamlconfig._LibyamlLoader  # the wheel ships libyaml
    return request.param


def test_the_line_of_a_refused_character_counts_lines_not_bytes():
    text = "naïve: é\ncafé: x\nbad: \x07\n"
    _, [problem] = load_config(text, limits=LIMITS)
    assert (problem.code, problem.line) == ("yaml_syntax", 3)


def test_valid_config_loads_as_a_mapping():
    config, problems = load_config("listen: 80\nupstreams: [a, b]\nflag: true\n", limits=LIMITS)
    assert problems == []
    assert config == {"listen": 80, "upstreams": ["a", "b"], "flag": True}


def test_empty_config_is_an_empty_mapping():
    assert load_config("", limits=LIMITS) == ({}, [])


def test_yaml_syntax_error_names_its_line():
    config, problems = load_config("a: 1\nb: 2\nc: : :\n", limits=LIMITS)
    assert config == {}
    [problem] = problems
    assert (problem.code, problem.file, problem.line) == ("yaml_syntax", "config", 3)


def test_config_over_the_size_limit_is_refused_before_parsing():
    text = "a: [" + "1, " * 2000 + "]\n"
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert problem.code == "yaml_too_large"
    assert problem.file == "config"
    assert str(len(text.encode())) in problem.message


def test_nesting_deeper_than_the_limit_is_refused_with_its_line():
    text = "ok: 1\nalso_ok: [1, 2]\ndeep: [[[[[[[[[[[[1]]]]]]]]]]]]\n"
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert (problem.code, problem.file, problem.line) == ("yaml_too_deep", "config", 3)


def test_nesting_within_the_limit_loads():
    config, problems = load_config("a: [[[[1]]]]\n", limits=LIMITS)
    assert problems == []
    assert config == {"a": [[[[1]]]]}


@pytest.mark.parametrize("text", ["[[[1]]]\n", "a: {b: {c: 1}}\n", "a: [[1]]\n"])
def test_nesting_exactly_at_the_limit_loads(text):
    config, problems = load_yaml(text, limits={**LIMITS, "max_config_depth": 3})
    assert problems == []


@pytest.mark.parametrize("text", ["[[[[1]]]]\n", "a: {b: {c: {d: 1}}}\n"])
def test_nesting_one_past_the_limit_is_refused(text):
    _, [problem] = load_yaml(text, limits={**LIMITS, "max_config_depth": 3})
    assert problem.code == "yaml_too_deep"


def test_a_hundred_thousand_open_brackets_do_not_exhaust_the_stack():
    limits = {**LIMITS, "max_config_bytes": 1_000_000}
    config, [problem] = load_config("[" * 100_000, limits=limits)  # no RecursionError
    assert config == {}
    assert problem.code == "yaml_too_deep"
    assert problem.line == 1


def test_nesting_built_from_aliases_is_caught_after_expansion():
    # Each alias adds a level the loader cannot see while composing.
    text = "a: &a [[[[[1]]]]]\nb: &b [*a, *a]\nc: &c [*b]\nd: [*c]\n"
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert problem.code == "yaml_too_deep"
    assert problem.key.startswith("d[0][0]")


BILLION_LAUGHS = """\
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""  # 9**9 (387 million) strings once expanded


def test_billion_laughs_fails_fast_as_too_large():
    limits = {**LIMITS, "max_config_depth": 32, "max_config_nodes": 100_000}
    started = time.monotonic()
    config, [problem] = load_config(BILLION_LAUGHS, limits=limits)
    assert time.monotonic() - started < 2
    assert config == {}
    assert problem.code == "yaml_too_large"
    assert problem.file == "config"


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("1: one\n", None),
        ("true: yes\n", None),
        ("null: nothing\n", None),
        ("outer:\n  2: two\n", "outer"),
    ],
)
def test_keys_must_be_strings(text, key):
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert problem.code == "yaml_key_type"
    assert problem.key == key


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("a: 1\nb: 2\na: 3\n", 3),
        ("outer:\n  x: 1\n  y: 2\n  x: 3\n", 4),
    ],
)
def test_duplicate_keys_are_refused_with_their_line(text, line):
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert problem.code == "yaml_syntax"
    assert "duplicate key" in problem.message
    assert problem.line == line


@pytest.mark.parametrize(
    ("text", "type_name"),
    [("- a\n- b\n", "list"), ("just a string\n", "str"), ("42\n", "int")],
)
def test_top_level_must_be_a_mapping(text, type_name):
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert (problem.code, problem.file, problem.line) == ("config_not_mapping", "config", 1)
    assert type_name in problem.message


def test_timestamps_stay_strings():
    config, problems = load_config(
        "day: 2024-01-02\nwhen: 2001-12-14t21:59:43.10-05:00\n", limits=LIMITS
    )
    assert problems == []
    assert config == {"day": "2024-01-02", "when": "2001-12-14t21:59:43.10-05:00"}


@pytest.mark.parametrize("value", [".nan", ".inf", "-.inf"])
def test_nan_and_infinity_are_refused(value):
    config, [problem] = load_config(f"ratio: {value}\n", limits=LIMITS)
    assert config == {}
    assert (problem.code, problem.key) == ("yaml_value_type", "ratio")


@pytest.mark.parametrize(
    ("text", "type_name"),
    [("blob: !!binary aGVsbG8=\n", "bytes"), ("members: !!set {a, b}\n", "set")],
)
def test_values_json_cannot_hold_are_refused(text, type_name):
    config, [problem] = load_config(text, limits=LIMITS)
    assert config == {}
    assert (problem.code, problem.key) == ("yaml_value_type", text.split(":")[0])
    assert type_name in problem.message


def test_python_tags_are_not_constructed():
    config, [problem] = load_config("x: !!python/object/apply:os.system [ls]\n", limits=LIMITS)
    assert config == {}
    assert (problem.code, problem.line) == ("yaml_syntax", 1)


def test_load_yaml_names_the_file_it_was_given():
    value, [problem] = load_yaml("a: [\n", limits=LIMITS, file="conf/app.yaml")
    assert value is None
    assert (problem.code, problem.file, problem.line) == ("yaml_syntax", "conf/app.yaml", 2)


def test_load_yaml_accepts_any_json_value_at_the_top():
    assert load_yaml("- 1\n- two\n", limits=LIMITS) == ([1, "two"], [])


# --- the JSON Schema ---------------------------------------------------------------


def test_an_invalid_schema_is_reported_against_the_schema():
    rendered = render_source(make_source(schema={"type": 5}))
    problem = only_problem(rendered)
    assert (problem.code, problem.key) == ("schema_invalid", "config_schema")


def test_schema_violations_are_all_reported_with_their_key_path():
    schema = {
        "type": "object",
        "required": ["name", "port"],
        "properties": {
            "name": {"type": "string"},
            "backend": {
                "type": "object",
                "properties": {"weights": {"type": "array", "items": {"type": "integer"}}},
            },
        },
    }
    config = "name: 7\nbackend:\n  weights: [1, two, 3]\n"
    rendered = render_source(make_source(config=config, schema=schema))
    found = {(p.code, p.file, p.key) for p in rendered.problems}
    assert found == {
        ("config_schema", "config", None),  # 'port' is a required property
        ("config_schema", "config", "name"),
        ("config_schema", "config", "backend.weights.1"),
    }
    assert any("'port' is a required property" in p.message for p in rendered.problems)


def test_a_config_that_satisfies_its_schema_renders():
    schema = {"type": "object", "properties": {"name": {"type": "string"}}}
    rendered = render_source(make_source(schema=schema, templates={"a.conf": "{{ name }}\n"}))
    assert rendered.is_valid, rendered.problems
    assert rendered.files == [{"path": "a.conf", "content": "shop\n"}]


# --- templates ---------------------------------------------------------------------


def test_templates_render_with_the_config_as_context():
    rendered = render_source(
        make_source(
            config="name: shop\nports: [80, 443]\n",
            templates={
                "nginx/site.conf": "{% for p in ports %}listen {{ p }};\n{% endfor %}",
                "app.json": '{"name": {{ name | tojson }}}\n',
            },
        )
    )
    assert rendered.is_valid, rendered.problems
    assert rendered.files == [
        {"path": "app.json", "content": '{"name": "shop"}\n'},
        {"path": "nginx/site.conf", "content": "listen 80;\nlisten 443;\n"},
    ]
    assert rendered.effective_config == {"name": "shop", "ports": [80, 443]}


@pytest.mark.parametrize(
    ("templates", "code", "file", "line"),
    [
        ({"site.conf": "line 1\nline 2\n{% if %}\n"}, "template_syntax", "site.conf", 3),
        ({"site.conf": "line 1\n{{ missing }}\n"}, "template_undefined", "site.conf", 2),
        ({"site.conf": "{{ name }}\n{{ name.nope.deeper }}\n"}, "template_undefined",
         "site.conf", 2),
        ({"site.conf": "a\nb\n{% include 'nope.conf' %}\n"}, "template_not_found",
         "site.conf", 3),
        ({"site.conf": "a\n{{ ''.__class__.__mro__ }}\n"}, "template_security", "site.conf", 2),
        ({"site.conf": "{{ 1 // 0 }}\n"}, "template_error", "site.conf", 1),
    ],
    ids=["syntax", "undefined", "undefined-attribute", "missing-include", "sandbox", "runtime"],
)
def test_template_errors_name_the_template_and_line(templates, code, file, line):
    rendered = render_source(make_source(templates=templates))
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.line) == (code, file, line)
    assert rendered.files == []


@pytest.mark.parametrize(
    "expression",
    ["missing | tojson", '{"a": missing} | tojson', "[1, missing] | tojson"],
)
def test_an_undefined_name_passed_to_tojson_is_reported_as_undefined(expression):
    rendered = render_source(make_source(templates={"app.json": "{{ " + expression + " }}\n"}))
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.line) == ("template_undefined", "app.json", 1)
    assert "missing" in problem.message


def test_an_error_in_an_included_template_names_the_included_template():
    rendered = render_source(
        make_source(templates={"site.conf": "{% include 'part.inc' %}\n",
                               "part.inc": "ok\nok\n{{ missing }}\n"})
    )
    assert not rendered.is_valid
    assert {(p.code, p.file, p.line) for p in rendered.problems} == {
        ("template_undefined", "part.inc", 3)
    }


def test_sandbox_refuses_reaching_python_internals_through_globals():
    rendered = render_source(
        make_source(templates={"x.conf": "ok\n{{ cycler.__init__.__globals__ }}\n"})
    )
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.line) == ("template_security", "x.conf", 2)
    assert rendered.files == []


def test_a_template_cannot_change_the_config_other_templates_see():
    rendered = render_source(
        make_source(
            config="servers: {web: 1}\nports: [80]\n",
            templates={
                "a.conf": "{{ servers.update({'evil': 2}) }}{{ ports.append(666) }}\n",
                "b.conf": "{{ servers | tojson }} {{ ports }}\n",
            },
        )
    )
    assert rendered.effective_config == {"servers": {"web": 1}, "ports": [80]}
    b_conf = [f["content"] for f in rendered.files if f["path"] == "b.conf"]
    assert b_conf == ['{"web": 1} [80]\n']


# --- rendered files must parse by extension ----------------------------------------


@pytest.mark.parametrize(
    ("path", "text", "code", "line"),
    [
        ("app.json", '{\n  "a": 1,\n  "b": \n}\n', "file_json", 4),
        ("app.yaml", "a: 1\nb: [\n", "file_yaml", 3),
        ("app.yml", "a: 1\nb: 2\na: 3\n", "file_yaml", 3),
        ("app.toml", 'a = 1\n[table]\nb = \n', "file_toml", 3),
        ("APP.JSON", "{", "file_json", 1),
    ],
)
def test_rendered_structured_files_must_parse(path, text, code, line):
    rendered = render_source(make_source(templates={path: text}))
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.line) == (code, path, line)


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("app.json", '{"a": [1, 2]}\n'),
        ("app.yaml", "a: [1, 2]\n"),
        ("app.toml", "a = [1, 2]\n"),
        ("app.conf", "{ not json at all\n"),
    ],
)
def test_rendered_files_that_parse_are_valid(path, text):
    assert render_source(make_source(templates={path: text})).is_valid


def test_a_fallback_file_is_checked_like_a_rendered_file():
    rendered = render_source(make_source(fallback={"safe.json": "{oops}\n"}))
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.line) == ("file_json", "safe.json", 1)


# --- sizes and paths ---------------------------------------------------------------


def test_a_template_rendering_over_the_file_limit_is_refused():
    rendered = render_source(
        make_source(templates={"big.conf": "{% for i in range(1000) %}0123456789{% endfor %}"},
                    max_file_bytes=100)
    )
    problem = only_problem(rendered)
    assert (problem.code, problem.file) == ("file_too_large", "big.conf")
    assert rendered.files == []


def test_a_fallback_file_over_the_file_limit_is_refused():
    rendered = render_source(make_source(fallback={"safe.conf": "x" * 101}, max_file_bytes=100))
    problem = only_problem(rendered)
    assert (problem.code, problem.file) == ("file_too_large", "safe.conf")


def test_files_together_over_the_snapshot_limit_are_refused():
    rendered = render_source(
        make_source(templates={"a.conf": "a" * 60, "b.conf": "b" * 30},
                    fallback={"c.conf": "c" * 30},
                    max_file_bytes=100, max_snapshot_bytes=100)
    )
    problem = only_problem(rendered)
    assert problem.code == "snapshot_too_large"
    assert "120 bytes" in problem.message


def test_sizes_are_counted_in_bytes_not_characters():
    rendered = render_source(make_source(templates={"a.conf": "é" * 60}, max_file_bytes=100))
    assert only_problem(rendered).code == "file_too_large"


def test_too_many_files_are_refused():
    rendered = render_source(
        make_source(templates={f"f{i}.conf": "x" for i in range(4)}, max_files=3)
    )
    assert only_problem(rendered).code == "too_many_files"


@pytest.mark.parametrize(
    ("path", "file"),
    [
        ("/etc/nginx/nginx.conf", "/etc/nginx/nginx.conf"),
        ("../outside.conf", "../outside.conf"),
        ("nginx/../../outside.conf", "nginx/../../outside.conf"),
        ("nginx\\site.conf", "nginx\\site.conf"),
        ("nginx//site.conf", "nginx//site.conf"),
        ("./site.conf", "./site.conf"),
        ("nginx/", "nginx/"),
        ("bad\x00name", "bad\x00name"),
        ("", None),
    ],
)
@pytest.mark.parametrize("kind", ["templates", "fallback_files"])
def test_unsafe_paths_are_refused(path, file, kind):
    if kind == "templates":
        source = make_source(templates={path: "x\n"})
    else:
        source = make_source(fallback={path: "x\n"})
    rendered = render_source(source)
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.key) == ("file_path", file, kind)
    assert rendered.files == []


@pytest.mark.parametrize("kind", ["templates", "fallback_files"])
def test_a_file_cannot_also_be_a_directory_of_another(kind):
    entries = {"nginx": "x\n", "nginx/site.conf": "y\n", "other.conf": "z\n"}
    source = make_source(**{"templates" if kind == "templates" else "fallback": entries})
    rendered = render_source(source)
    problem = only_problem(rendered)
    assert (problem.code, problem.file, problem.key) == ("file_path", "nginx", kind)
    assert "nginx/site.conf" in problem.message


def test_a_template_and_a_fallback_file_may_share_a_path():
    rendered = render_source(make_source(templates={"nginx/site.conf": "live\n"},
                                         fallback={"nginx/site.conf": "safe\n"}))
    assert rendered.is_valid, rendered.problems


# --- several problems at once ------------------------------------------------------


def test_every_problem_in_a_source_is_reported():
    schema = {"type": "object", "properties": {"port": {"type": "integer"}}}
    rendered = render_source(
        make_source(
            config="name: shop\nport: eighty\n",
            schema=schema,
            templates={
                "a.conf": "{{ missing }}\n",
                "b.conf": "{% if %}\n",
                "c.json": "{\n",
                "d.conf": "{{ ''.__class__ }}\n",
                "e.conf": "{{ name }}\n",
            },
            fallback={"f.yaml": "a: [\n"},
        )
    )
    assert {(p.code, p.file) for p in rendered.problems} == {
        ("config_schema", "config"),
        ("template_undefined", "a.conf"),
        ("template_syntax", "b.conf"),
        ("file_json", "c.json"),
        ("template_security", "d.conf"),
        ("file_yaml", "f.yaml"),
    }
    report = rendered.report()
    assert report["valid"] is False
    assert len(report["errors"]) == 6
    syntax_error = next(e for e in report["errors"] if e["code"] == "template_syntax")
    assert (syntax_error["file"], syntax_error["line"]) == ("b.conf", 1)


def test_templates_are_syntax_checked_even_when_the_config_does_not_parse():
    rendered = render_source(
        make_source(config="a: [\n", templates={"ok.conf": "{{ a }}\n",
                                                 "bad.conf": "ok\n{% for %}\n"})
    )
    assert {(p.code, p.file, p.line) for p in rendered.problems} == {
        ("yaml_syntax", "config", 2), ("template_syntax", "bad.conf", 2)
    }


def test_an_unsafe_path_does_not_hide_problems_in_other_files():
    rendered = render_source(
        make_source(templates={"/abs": "x", "a.conf": "{{ missing }}\n", "b.conf": "{{ name }}\n"})
    )
    assert {(p.code, p.file) for p in rendered.problems} == {
        ("file_path", "/abs"), ("template_undefined", "a.conf")
    }
    assert rendered.files == [{"path": "b.conf", "content": "shop\n"}]


def test_an_error_in_a_template_included_twice_is_reported_once():
    rendered = render_source(
        make_source(templates={"a.conf": "{% include 'part.inc' %}",
                               "b.conf": "{% include 'part.inc' %}",
                               "part.inc": "{{ missing }}"})
    )
    assert [(p.code, p.file, p.line) for p in rendered.problems] == [
        ("template_undefined", "part.inc", 1)
    ]


def test_every_unsafe_path_is_reported():
    rendered = render_source(
        make_source(templates={"/abs": "x", "ok.conf": "x", "../up": "x"},
                    fallback={"a\\b": "x"})
    )
    assert {(p.code, p.file) for p in rendered.problems} == {
        ("file_path", "/abs"), ("file_path", "../up"), ("file_path", "a\\b")
    }


# --- checksum and determinism ------------------------------------------------------


def test_checksum_is_sha256_of_the_canonical_sorted_json():
    files = [{"path": "b.conf", "content": "bé\n"}, {"path": "a.conf", "content": "a\n"}]
    canonical = json.dumps([["a.conf", "a\n"], ["b.conf", "bé\n"]], ensure_ascii=False,
                           separators=(",", ":"))
    assert content_checksum(files) == "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def test_checksum_does_not_depend_on_file_order():
    files = [{"path": f"f{i}.conf", "content": str(i)} for i in range(5)]
    assert content_checksum(files) == content_checksum(list(reversed(files)))


@pytest.mark.parametrize(
    "changed",
    [
        [{"path": "a.conf", "content": "a2\n"}, {"path": "b.conf", "content": "b\n"}],
        [{"path": "a.conf", "content": "a\n"}, {"path": "c.conf", "content": "b\n"}],
        [{"path": "a.conf", "content": "a\n"}],
        [{"path": "a.conf", "content": "a\nb\n"}, {"path": "b.conf", "content": ""}],
    ],
    ids=["content", "path", "removed-file", "content-moved-between-files"],
)
def test_checksum_changes_with_content(changed):
    base = [{"path": "a.conf", "content": "a\n"}, {"path": "b.conf", "content": "b\n"}]
    assert content_checksum(changed) != content_checksum(base)


def test_rendered_checksum_covers_the_rendered_files():
    rendered = render_source(make_source(templates={"a.conf": "{{ name }}\n"}))
    assert rendered.checksum == content_checksum([{"path": "a.conf", "content": "shop\n"}])


def test_rendering_is_deterministic():
    source = make_source(
        config="servers:\n  web1: 10.0.0.1\n  web2: 10.0.0.2\n  db: 10.0.0.3\nname: shop\n",
        templates={
            "hosts": "{% for n, ip in servers.items() %}{{ ip }} {{ n }}\n{% endfor %}",
            "z/app.json": "{{ servers | tojson }}\n",
            "a.conf": "{{ name }}\n",
        },
        fallback={"safe.conf": "safe\n"},
    )
    first, second = render_source(source), render_source(json.loads(json.dumps(source)))
    assert first.is_valid, first.problems
    assert first.files == second.files
    assert first.fallback_files == second.fallback_files
    assert first.checksum == second.checksum
    assert [f["path"] for f in first.files] == ["a.conf", "hosts", "z/app.json"]
    assert first.files[1]["content"] == "10.0.0.1 web1\n10.0.0.2 web2\n10.0.0.3 db\n"
