"""A `vault:` or `file:` reference whose path has an empty, `.` or `..` segment is
refused: in the environment's and a descriptor's `secrets` (merge, naming the key),
and inline in the environment's config or templates (render, naming file and line).
Otherwise `vault:secret/data/shop/../blog#k` would pass the pattern
`vault:secret/data/shop/*` while naming another application's secret."""

import pytest

from configlang.merge import merge
from configlang.secrets import reference_refusal
from tests.configlang.test_secrets import ENV_CONFIG, descriptor, render

ESCAPING = [
    "vault:secret/data/shop/../blog#password",
    "vault:secret/data/shop/..#password",
    "vault:secret/data/shop/%2e%2e/blog#password",
    "vault:secret/data/shop/%2E./blog#password",
    "vault:secret/data/shop/%2e%2e%2fblog#password",
    "vault:secret/data/shop/..%2fblog#password",
    "vault:secret/data/shop/..%2Fblog#password",
    "vault:secret/data/shop/%252e%252e/blog#password",
    "vault:secret/data/shop/%25252e%25252e/blog#password",
    "vault:secret/data/shop/..%5cblog#password",
    "vault:secret/data/shop/..\\blog#password",
    "vault:secret/data/shop/db%2f..%2f..%2fblog#password",
    "vault:secret/data/shop/100%#password",
    "vault:secret/data/shop/./db#password",
    "vault:secret/data/shop//db#password",
    "vault:secret/data/shop/#password",
    "vault:/secret/data/shop/db#password",
    "file:/etc/shop/../blog/db",
    "file:/etc/shop/./db",
    "file:/etc/shop//db",
    "file:/etc/shop/",
    "file://etc/shop/db",
    "file:/..",
]
PLAIN = ["vault:secret/data/shop/db#password", "vault:kv/shop#api-key",
         "vault:secret/data/shop/db..backup#k", "vault:secret/data/shop/.hidden#k",
         "vault:secret/data/shop/db%20main#k", "vault:secret/data/shop/db#k%2f..",
         "file:/etc/shop/db", "file:/etc/shop/..db", "file:/run/secrets/tok", "env:SHOP_DB"]
PERMISSIVE = {"descriptor_policy": {"secret_refs": ["vault:secret/data/{application}/*",
                                                    "file:/etc/{application}/*"]}}


def _merge(desc, environment=None):
    return merge(environment=environment or {}, policy=PERMISSIVE, tenant=None,
                 descriptor=desc, application="shop", environment_name="prod")


@pytest.mark.parametrize("reference", ESCAPING)
def test_a_descriptor_cannot_escape_its_policys_pattern_with_dot_segments(reference):
    merged = _merge(descriptor() | {"secrets": {"db": reference}})

    [error] = merged.errors
    assert (error.layer, error.path) == ("descriptor", "secrets.db")
    assert "segment" in error.message
    assert "secrets" not in merged.config or "db" not in merged.config["secrets"]


@pytest.mark.parametrize("reference", ESCAPING)
def test_the_environment_cannot_declare_such_a_reference_either(reference):
    merged = _merge(None, environment={"secrets": {"db": reference}})

    [error] = merged.errors
    assert (error.layer, error.path) == ("environment", "secrets.db")


@pytest.mark.parametrize("reference", PLAIN)
def test_plain_paths_are_references_as_before(reference):
    assert reference_refusal(reference) is None
    permissive = {"descriptor_policy": {"secret_refs": ["*"]}}
    merged = merge(environment={}, policy=permissive, tenant=None,
                   descriptor=descriptor() | {"secrets": {"db": reference}},
                   application="shop", environment_name="prod")
    assert merged.errors == []


@pytest.mark.parametrize("reference", ESCAPING)
def test_an_inline_reference_in_a_template_is_invalid_naming_file_and_line(reference):
    rendered, _ = render({"app.conf": "a=1\nkey=${secret:" + reference + "}\n"})

    assert not rendered.is_valid
    assert [(p.code, p.file, p.line) for p in rendered.problems] == [
        ("secret_reference", "app.conf", 2)]
    assert reference in rendered.problems[0].message


def test_an_inline_reference_in_the_environments_config_is_invalid_where_placed():
    config = ENV_CONFIG + 'other: "${secret:vault:secret/data/shop/../blog#k}"\n'

    rendered, _ = render({"app.conf": "x\n\n{{ other }}\n"}, config=config)

    assert [(p.code, p.file, p.line) for p in rendered.problems] == [
        ("secret_reference", "app.conf", 3)]
