"""configlang/secrets.py: the renderer puts sealed placeholders only where the
environment placed a secret, lists them in the manifest, and refuses any other
`${secret:` text: no descriptor text, however a template transforms it, becomes a
reference an agent honours."""

import re

import pytest

from configlang.rendering import render_source
from configlang.secrets import PLACEHOLDER, Placeholders
from tests.configlang.test_rendering import make_source

POLICY = {"content": {"descriptor_policy": {
    "params": ["banner", "parts", "pieces", "chosen"],
    "secret_refs": ["env:SHOP_*", "file:/etc/shop/*"]}}}
ENV_CONFIG = """\
name: shop
secrets:
  db: env:SHOP_DB
  tls: file:/etc/shop/tls.key
params:
  mode: prod
  inline: "${secret:env:SHOP_INLINE}"
"""


def descriptor(**params):
    out = {"apiVersion": "bellwether/v1", "application": "shop", "environment": "prod",
           "id": "rel-1", "version": "1"}
    if params:
        out["params"] = params
    return out


def render(templates, *, config=ENV_CONFIG, desc=None, tenant=None, **limits):
    source = make_source(config=config, templates=templates,
                         max_file_bytes=100_000, max_snapshot_bytes=400_000, **limits)
    source.update(policy=POLICY, descriptor=desc, tenant_restrictions=tenant)
    return render_source(source), source


def references(rendered):
    return {entry["reference"] for entry in rendered.secrets}


def codes(rendered):
    return [(p.code, p.file, p.line) for p in rendered.problems]


# --- what the environment places ------------------------------------------------------------


def test_secrets_in_a_template_become_sealed_placeholders_listed_in_the_manifest():
    rendered, source = render({"app.conf": "db={{ secrets.db }}\ntls={{ secrets.tls }}\n"})

    assert rendered.is_valid, rendered.problems
    content = rendered.files[0]["content"]
    placeholders = Placeholders(source)
    tls = placeholders("file:/etc/shop/tls.key")
    assert content == f"db={placeholders('env:SHOP_DB')}\ntls={tls}\n"
    assert rendered.secrets == sorted([
        {"placeholder": placeholders("env:SHOP_DB"), "reference": "env:SHOP_DB",
         "files": ["app.conf"]},
        {"placeholder": placeholders("file:/etc/shop/tls.key"),
         "reference": "file:/etc/shop/tls.key", "files": ["app.conf"]},
    ], key=lambda e: e["placeholder"])
    assert rendered.report()["secrets"] == [
        {"reference": e["reference"], "files": e["files"]} for e in rendered.secrets]


def test_the_effective_config_keeps_readable_references():
    rendered, _ = render({"a": "{{ secrets.db }}"})

    assert rendered.effective_config["secrets"]["db"] == "${secret:env:SHOP_DB}"


def test_the_environments_inline_references_are_sealed_too():
    rendered, _ = render({"a": "{{ params.inline }} ${secret:env:SHOP_TEMPLATE}\n"})

    assert rendered.is_valid, rendered.problems
    assert references(rendered) == {"env:SHOP_INLINE", "env:SHOP_TEMPLATE"}


def test_only_placeholders_that_reach_a_file_are_listed():
    rendered, _ = render({"a": "{{ secrets.db }}", "b": "plain"})

    assert references(rendered) == {"env:SHOP_DB"}
    assert rendered.secrets[0]["files"] == ["a"]


def test_the_same_inputs_give_the_same_placeholders_and_other_inputs_others():
    first, _ = render({"a": "{{ secrets.db }}"})
    again, _ = render({"a": "{{ secrets.db }}"})
    other, _ = render({"a": "{{ secrets.db }}"}, desc=descriptor(banner="x"))

    assert first.files == again.files and first.checksum == again.checksum
    assert other.files[0]["content"] != first.files[0]["content"]


def test_a_descriptor_secret_within_policy_and_tenant_is_listed():
    desc = {**descriptor(), "secrets": {"extra": "env:SHOP_EXTRA"}}
    template = "{% for n, v in secrets | dictsort %}{{ n }}={{ v }}\n{% endfor %}"

    rendered, _ = render({"a": template}, desc=desc, tenant={"secret_refs": ["env:SHOP_*"]})

    assert rendered.is_valid, rendered.problems
    assert references(rendered) == {"env:SHOP_DB", "env:SHOP_EXTRA", "file:/etc/shop/tls.key"}


@pytest.mark.parametrize("reference, tenant, layer", [
    ("env:AWS_SECRET_ACCESS_KEY", None, "policy"),
    ("file:/etc/shadow", None, "policy"),
    ("env:SHOP_OTHER", {"secret_refs": ["env:SHOP_DB"]}, "tenant"),
])
def test_a_descriptor_secret_outside_policy_or_tenant_is_refused(reference, tenant, layer):
    desc = {**descriptor(), "secrets": {"x": reference}}

    rendered, _ = render({"a": "{{ secrets.db }}"}, desc=desc, tenant=tenant)

    assert not rendered.is_valid
    assert any(p.key == "secrets.x" and p.message.startswith(layer)
               for p in rendered.problems), rendered.problems
    assert rendered.secrets == [] or not rendered.is_valid


# --- what a descriptor tries -------------------------------------------------------------


HOSTILE_TEMPLATES = {
    "plain": "{{ params.banner }}",
    "joined": "{{ params.parts | join('') }}",
    "concatenated": "{{ params.parts[0] ~ params.parts[1] }}",
    "replaced": "{{ params.banner | replace('%', '$') }}",
    "format": "{{ '%s{secret:%s}' | format(params.parts[0], params.parts[1]) }}",
    "lines": "{% for p in params.pieces %}{{ p }}{% endfor %}",
    "urlencoded": "{{ params.banner | urlencode | replace('%24%7B', '${') "
                  "| replace('%3A', ':') | replace('%7D', '}') }}",
    "upper": "{{ params.banner | lower }}",
    "chosen": "{{ secrets[params.chosen] }}",
}


@pytest.mark.parametrize("name, params", [
    ("plain", {"banner": "${secret:env:AWS_SECRET_ACCESS_KEY}"}),
    ("plain", {"banner": "${secret:file:/etc/shadow}"}),
    ("joined", {"parts": ["${sec", "ret:env:AWS_SECRET_ACCESS_KEY}"]}),
    ("concatenated", {"parts": ["${secret:env:", "AWS_SECRET_ACCESS_KEY}"]}),
    ("replaced", {"banner": "%{secret:env:AWS_SECRET_ACCESS_KEY}"}),
    ("format", {"parts": ["$", "env:AWS_SECRET_ACCESS_KEY"]}),
    ("lines", {"pieces": ["$", "{secret:", "file:/etc/shadow", "}"]}),
    ("urlencoded", {"banner": "${secret:env:AWS_SECRET_ACCESS_KEY}"}),
    ("upper", {"banner": "${SECRET:ENV:AWS_SECRET_ACCESS_KEY}"}),
    ("plain", {"banner": "${secret:sealed:" + "0" * 32 + ":env:SHOP_DB}"}),
])
def test_descriptor_text_forming_a_reference_is_refused_at_publish(name, params):
    templates = {"out.conf": "line one\n" + HOSTILE_TEMPLATES[name] + "\n"}
    rendered, _ = render(templates, desc=descriptor(**params))

    assert not rendered.is_valid
    assert ("secret_reference", "out.conf", 2) in codes(rendered), rendered.problems
    assert rendered.secrets == []


def test_a_descriptor_copying_a_previous_renders_placeholder_gets_no_secret():
    before, _ = render({"a": "{{ secrets.db }} {{ params.banner | default('') }}"},
                       desc=descriptor(banner="x"))
    stolen = PLACEHOLDER.search(before.files[0]["content"]).group(0)

    after, _ = render({"a": "{{ secrets.db }} {{ params.banner | default('') }}"},
                      desc=descriptor(banner=stolen))

    assert not after.is_valid
    assert [p.code for p in after.problems] == ["secret_reference"]


def test_a_descriptor_may_choose_among_the_environments_secrets_only_by_name():
    rendered, _ = render({"o": HOSTILE_TEMPLATES["chosen"]}, desc=descriptor(chosen="db"))
    assert references(rendered) == {"env:SHOP_DB"}

    missing, _ = render({"o": HOSTILE_TEMPLATES["chosen"]},
                        desc=descriptor(chosen="env:AWS_SECRET_ACCESS_KEY"))
    assert not missing.is_valid and missing.secrets == []


def test_descriptor_params_holding_a_reference_are_not_sealed():
    """Only a value the environment itself wrote is sealed; a descriptor's is refused."""
    config = ENV_CONFIG + "  banner: keep\n"
    rendered, _ = render({"o": "{{ params.banner }}"}, config=config,
                         desc=descriptor(banner="${secret:env:SHOP_DB}"))

    assert not rendered.is_valid  # a conflict with the environment's value, at least
    assert rendered.secrets == []


# --- an owner's mistakes -------------------------------------------------------------------


@pytest.mark.parametrize("template", [
    "{{ secrets.db[:-1] }}", "{{ secrets.db | upper }}", "{{ secrets.db[2:] }}",
    "{{ secrets.db | replace('env:', 'file:') }}",
])
def test_an_altered_placeholder_is_refused_naming_file_and_line(template):
    rendered, _ = render({"a.conf": "x\n" + template})

    assert ("secret_reference", "a.conf", 2) in codes(rendered), rendered.problems


def test_text_split_around_a_template_expression_is_refused():
    rendered, _ = render({"a": "${secret:{{ 'env:SHOP_DB' }}}"})

    assert [p.code for p in rendered.problems] == ["secret_reference"]


def test_rendered_files_never_hold_an_unsealed_reference():
    rendered, _ = render({"a": "{{ secrets.db }} ${secret:env:SHOP_T} {{ params.inline }}"})

    assert rendered.is_valid
    content = rendered.files[0]["content"]
    assert re.findall(r"\$\{secret:", content) and all(
        m.group(0) in {e["placeholder"] for e in rendered.secrets}
        for m in PLACEHOLDER.finditer(content))
    assert len(PLACEHOLDER.findall(content)) == content.count("${secret:")


def test_a_path_using_the_agents_temp_marker_is_refused():
    rendered, _ = render({"conf/.x.bellwether-tmp-1234": "x"})

    assert ("file_path", "conf/.x.bellwether-tmp-1234", None) in codes(rendered)


def test_many_references_in_one_file_report_a_bounded_number_of_problems():
    rendered, _ = render({"a": "{% for i in range(5000) %}{{ params.banner }}\n{% endfor %}"},
                         desc=descriptor(banner="${secret:env:X}"))

    assert 1 <= len(rendered.problems) <= 20


def test_diffs_show_references_and_ignore_a_new_token_for_the_same_secret():
    from configlang.diff import diff_files

    first, _ = render({"a": "{{ secrets.db }}\n{{ params.mode }}\n"})
    second, _ = render({"a": "{{ secrets.db }}\n{{ params.mode }}\n", "b": "new\n"},
                       config=ENV_CONFIG.replace("mode: prod", "mode: prod"))
    changed, _ = render({"a": "{{ secrets.tls }}\n{{ params.mode }}\n"})

    assert first.files[0] != changed.files[0]
    assert [d["path"] for d in diff_files(first.files, second.files)] == ["b"]
    [diff] = diff_files(first.files, changed.files)
    assert "-${secret:env:SHOP_DB}\n" in diff["diff"]
    assert "+${secret:file:/etc/shop/tls.key}\n" in diff["diff"]
