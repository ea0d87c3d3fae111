"""Hostile YAML wherever YAML is read through the API: control characters (which
PyYAML's reader refuses while it is built), a BOM or U+FFFE inside the text, tabs,
deep nesting and alias bombs. Every answer is a 400 with the error envelope naming
the line, and nothing is stored."""

import json

import pytest

from apps.environments.models import Environment
from tests import factories
from tests.api.test_hostile_input import fingerprint
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db

DESCRIPTOR = ('apiVersion: bellwether/v1\napplication: shop\nenvironment: prod\n'
              'id: r1\nversion: "1"\n')
# (text put on the last line, a word of the expected message)
BAD_VALUES = [
    ("a\x07b", "#x0007"), ("a\x1bb", "#x001b"), ("a\x7fb", "#x007f"), ("a\x0bb", "#x000b"),
    ("a\ufffeb", "#xfffe"), ("a\x01b", "#x0001"), ("\tx: [", "config:2"),
    ("[" * 200, "deep"), ("{x: " * 200, "deep"),
]
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
    f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
    for i in range(8))


@pytest.fixture
def world(superuser, environment, empty_cache):
    return factories.api_client_for(superuser)


def _details_name_a_line(error):
    assert error["details"], error
    assert any(d.get("line") for d in error["details"]) or "line" in error["message"], error


@pytest.mark.parametrize(("where", "line"), [("notes", 6), ("params", 7)])
@pytest.mark.parametrize(("bad", "word"), BAD_VALUES[:6])
def test_control_characters_in_a_yaml_descriptor_are_400_naming_the_body_line(
        world, where, line, bad, word):
    body = DESCRIPTOR + (f"notes: {bad}\n" if where == "notes" else f"params:\n  k: {bad}\n")
    before = fingerprint()
    for content_type in ("application/yaml", "text/yaml"):
        response = world.post("/api/v1/descriptors", data=body.encode(),
                              content_type=content_type)
        error = assert_error(response, 400, "parse_error")
        assert word in error["message"] and f"body:{line}" in error["message"], error
    assert fingerprint() == before


@pytest.mark.parametrize("body", [b"id: \xff\n", b"id: \xc0\xae\n", b"id: \xed\xa0\x80\n",
                                  b"a: " + b"[" * 5000, BOMB.encode()])
def test_undecodable_deep_or_exploding_yaml_bodies_are_400(world, body):
    before = fingerprint()
    response = world.post("/api/v1/descriptors", data=body, content_type="application/yaml")
    assert_error(response, 400, "parse_error")
    assert fingerprint() == before


@pytest.mark.parametrize(("bad", "word"), BAD_VALUES)
def test_a_config_patch_with_bad_yaml_is_400_naming_config_and_stores_nothing(
        world, bad, word):
    config_before = Environment.objects.get(name="prod").config
    before = fingerprint()
    response = world.patch("/api/v1/environments/shop/prod",
                           data=json.dumps({"config": f"listen: 80\nk: {bad}"}),
                           content_type="application/json")
    error = assert_error(response, 400)
    assert "config" in error["message"] and word in error["message"], error
    _details_name_a_line(error)
    assert fingerprint() == before
    assert Environment.objects.get(name="prod").config == config_before


def test_an_alias_bomb_in_a_config_patch_is_400(world):
    response = world.patch("/api/v1/environments/shop/prod",
                           data=json.dumps({"config": BOMB}), content_type="application/json")
    error = assert_error(response, 400)
    assert "config" in error["message"], error


def test_a_bom_inside_a_config_value_is_kept_as_text(world):
    response = world.patch("/api/v1/environments/shop/prod",
                           data=json.dumps({"config": "k: a\ufeffb\n"}),
                           content_type="application/json")
    assert response.status_code == 200, response.content
