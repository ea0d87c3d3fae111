"""The environment may declare the mode of the files receiving secrets
(`secret_file_mode`, an octal string): rendered into the snapshot, covered by its
checksum; a mode that lets others in, lets the group write, or keeps the owner out
is a problem naming the key. Only the environment's own config declares it."""

import pytest

from configlang.rendering import content_checksum, render_source
from configlang.secrets import secret_file_mode
from tests.configlang.test_rendering import make_source
from tests.configlang.test_secrets import descriptor, render

TEMPLATES = {"app.conf": "db={{ secrets.db }}\n"}
CONFIG = "name: shop\nsecrets:\n  db: env:SHOP_DB\n"


def config_with(mode: str) -> str:
    return CONFIG + f"secret_file_mode: {mode}\n"


@pytest.mark.parametrize(("declared", "normalized"), [
    ('"0640"', "0640"), ('"640"', "0640"), ("'0440'", "0440"), ('"0400"', "0400"),
    ('"0750"', "0750"), ('"0700"', "0700"), ('"0600"', None), ('"600"', None),
])
def test_a_declared_mode_is_rendered_and_covered_by_the_checksum(declared, normalized):
    rendered, _ = render(TEMPLATES, config=config_with(declared))
    plain, _ = render(TEMPLATES, config=CONFIG)

    assert rendered.is_valid, rendered.problems
    assert rendered.secret_file_mode == normalized
    assert rendered.checksum == content_checksum(rendered.files, normalized)
    assert (rendered.checksum == plain.checksum) is (normalized is None)
    assert rendered.report().get("secret_file_mode") == normalized


@pytest.mark.parametrize("declared", [
    '"0644"', '"0604"', '"0601"', '"0660"', '"0664"', '"0666"', '"0777"', '"0620"',
    '"0200"', '"0000"', '"0300"', '"4640"', '"2640"', '"00640"', '"0o640"', '"0x1a0"',
    '"0648"', '"rw-r-----"', '""', '" 0640"', '"0640 "',
    "0640", "640", "416", "0o640", "null", "true", "[0640]", "{mode: '0640'}",
])
def test_a_mode_exposing_a_secret_or_not_a_mode_is_a_problem_naming_the_key(declared):
    rendered, _ = render(TEMPLATES, config=config_with(declared))

    assert not rendered.is_valid
    [problem] = rendered.problems
    assert (problem.code, problem.file, problem.key) == ("secret_file_mode", "config",
                                                        "secret_file_mode")
    assert rendered.secret_file_mode is None


@pytest.mark.parametrize(("declared", "reason"), [
    ("0644", "others"), ("0660", "group write"), ("0240", "owner not read"),
    (640, "a number"),
])
def test_each_refusal_says_why(declared, reason):
    _, [problem] = secret_file_mode({"secret_file_mode": declared})
    expected = {"others": "grants access to others", "group write": "lets the group write",
                "owner not read": "does not let the owner read",
                "a number": "quoted string"}[reason]
    assert expected in problem.message


def test_a_descriptor_cannot_declare_the_mode():
    desc = {**descriptor(), "secret_file_mode": "0640"}
    rendered, _ = render(TEMPLATES, config=CONFIG, desc=desc)

    assert not rendered.is_valid
    assert any(p.key == "secret_file_mode" and "belongs to the environment" in p.message
               for p in rendered.problems), rendered.problems
    assert rendered.secret_file_mode is None


def test_a_descriptors_params_do_not_declare_the_mode():
    source = make_source(config=CONFIG + "params: {}\n", templates=TEMPLATES)
    source.update(descriptor=descriptor(secret_file_mode="0640"), tenant_restrictions=None,
                  policy={"content": {"descriptor_policy": {"params": ["secret_file_mode"]}}})

    rendered = render_source(source)

    assert rendered.is_valid, rendered.problems
    assert rendered.effective_config["params"]["secret_file_mode"] == "0640"
    assert rendered.secret_file_mode is None


def test_without_the_key_nothing_changes():
    assert secret_file_mode({"name": "shop"}) == (None, [])
    assert secret_file_mode(None) == (None, [])
