"""Hostile input against every operation of the OpenAPI schema: NUL and lone
surrogates in every JSON field, in keys, in query parameters and in paths;
huge numbers in every integer field and query parameter. Every answer is a 4xx
with the error envelope (never a 5xx), and a refused request stores nothing.

The operations come from the schema drf-spectacular generates from the URLconf,
so a new route is attacked without being listed here."""

import hashlib
import json

import pytest
from django.apps import apps
from django.db import transaction
from drf_spectacular.generators import SchemaGenerator

from apps.environments.models import Environment
from tests import factories
from tests.api_helpers import assert_error
from tests.core.test_parsers import BAD_STRINGS

pytestmark = pytest.mark.django_db

HUGE = 99999999999999999999
NUMBERS = (HUGE, -HUGE, 2**63, 2**31, -1, 1e308, "1e400")
NOT_NUMBERS = {"string", "boolean", "array", "object"}
OURS = {"tenancy", "environments", "snapshots", "audit", "fleet", "rollouts"}
VOLATILE = {"last_used_at", "last_seen_at", "updated_at"}


def _schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


SCHEMA = None


def operations():
    global SCHEMA
    if SCHEMA is None:
        SCHEMA = _schema()
    found = []
    for path, methods in SCHEMA["paths"].items():
        for method, operation in methods.items():
            found.append((method, path, operation))
    return found


def _resolve(schema: dict) -> dict:
    ref = schema.get("$ref")
    if ref:
        return _resolve(SCHEMA["components"]["schemas"][ref.rsplit("/", 1)[1]])
    return schema


def body_properties(operation) -> dict[str, dict]:
    content = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if not content:
        return {}
    return {name: _resolve(prop)
            for name, prop in _resolve(content["schema"]).get("properties", {}).items()}


def _op_id(op) -> str:
    method, path, _ = op
    return f"{method.upper()} {path.removeprefix('/api/v1/')}"


def fingerprint() -> str:
    """A digest of every row of the project's models (timestamps of use left out)."""
    digest = hashlib.sha256()
    for model in sorted(apps.get_models(), key=lambda m: m._meta.label):
        if model._meta.app_label not in OURS:
            continue
        fields = [f.attname for f in model._meta.concrete_fields if f.attname not in VOLATILE]
        for row in model.objects.order_by("pk").values_list(*fields):
            digest.update(repr(row).encode())
    return digest.hexdigest()


def url_for(path: str, values: dict) -> str:
    if "/templates/" in path:
        values = {**values, "path": "nginx/shop.conf"}
    elif "/fallback-files/" in path:
        values = {**values, "path": "www/index.html"}
    return path.format(**values)


def client_for(world, path: str):
    return world["agent"] if path.startswith("/api/v1/agent/") else world["user"]


def send(client, method: str, url: str, raw: str | None):
    if raw is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, data=raw.encode("utf-8"), content_type="application/json")


def assert_refused(response, what: str):
    assert 400 <= response.status_code < 500, (what, response.status_code, response.content[:300])
    assert_error(response, response.status_code)


@pytest.fixture(scope="module")
def world_fingerprint(shared_world) -> str:
    """The shared world's fingerprint: what every test here starts from."""
    return fingerprint()


BODY_OPERATIONS = [op for op in operations() if body_properties(op[2])]
QUERY_OPERATIONS = [op for op in operations()
                    if any(p["in"] == "query" for p in op[2].get("parameters", []))]


@pytest.mark.parametrize("op", BODY_OPERATIONS, ids=_op_id)
def test_nul_and_lone_surrogates_in_any_body_field_are_400_naming_it_and_store_nothing(
        op, hostile_world, world_fingerprint):
    """Where a bad string may sit and what the refusal names is the parser's one
    decision (tests/core/test_parsers.py); here every field of every route is sent
    one as its value and one nested, the bad strings and the nestings taken in turn
    across the fields, and a route's top-level key one of them."""
    method, path, operation = op
    url = url_for(path, hostile_world["values"])
    client = client_for(hostile_world, path)
    before = world_fingerprint
    for index, field in enumerate(body_properties(operation)):
        bad = BAD_STRINGS[index % len(BAD_STRINGS)]
        response = send(client, method, url, f'{{"{field}": {bad}}}')
        what = f"{method} {path} {field}={bad}"
        assert_refused(response, what)
        assert response.json()["error"]["details"][0]["field"] == field, what
        bad = BAD_STRINGS[(index + 1) % len(BAD_STRINGS)]
        nested = (f"[{bad}]", f'{{"k": {bad}}}', f'{{{bad}: "v"}}')[index % 3]
        assert_refused(send(client, method, url, f'{{"{field}": {nested}}}'),
                       f"{method} {path} {field}={nested}")
    bad = BAD_STRINGS[BODY_OPERATIONS.index(op) % len(BAD_STRINGS)]
    assert_refused(send(client, method, url, f'{{{bad}: 1}}'), f"{method} {path} key {bad}")
    # Every request above was refused, so none may have stored anything.
    assert fingerprint() == before, f"{method} {path}: something was stored"


@pytest.mark.parametrize("op", BODY_OPERATIONS, ids=_op_id)
def test_huge_and_negative_numbers_in_any_body_field_are_never_a_5xx(op, hostile_world,
                                                                     world_fingerprint):
    method, path, operation = op
    url = url_for(path, hostile_world["values"])
    client = client_for(hostile_world, path)
    before = world_fingerprint
    for field, schema in body_properties(operation).items():
        # A number where text, a flag, a list or an object belongs is refused for its
        # type, or (text) taken as its digits: long and short.
        numbers = (HUGE, -1) if schema.get("type") in NOT_NUMBERS else NUMBERS
        for number in numbers:
            raw = f'{{"{field}": {number}}}'
            with transaction.atomic():
                response = send(client, method, url, raw)
                assert response.status_code < 500, (raw, response.status_code,
                                                     response.content)
                if response.status_code >= 400:
                    assert_error(response, response.status_code)
                else:  # what an accepted number stores is not this test's question
                    transaction.set_rollback(True)
    # What the refused numbers above left stays: there must be none.
    assert fingerprint() == before, f"{method} {path}: a refused number stored something"


@pytest.mark.parametrize("op", QUERY_OPERATIONS, ids=_op_id)
def test_hostile_query_parameters_are_never_a_5xx(op, hostile_world):
    method, path, operation = op
    url = url_for(path, hostile_world["values"])
    client = client_for(hostile_world, path)
    for parameter in [p["name"] for p in operation["parameters"] if p["in"] == "query"]:
        for value in (str(HUGE), "-1", "1e9", "%00", "a%00b", "%ED%A0%80", "9" * 5000):
            response = getattr(client, method)(f"{url}?{parameter}={value}")
            assert response.status_code < 500, (parameter, value, response.status_code)
            if response.status_code >= 400:
                assert_error(response, response.status_code)


@pytest.mark.parametrize("op", [op for op in operations() if "{" in op[1]], ids=_op_id)
def test_huge_ids_and_nul_in_url_paths_are_4xx_never_5xx(op, hostile_world, world_fingerprint):
    method, path, _ = op
    before = world_fingerprint
    for value in (str(HUGE), str(2**63), str(2**31), "0", "%00", "a%E2%80%AEb"):
        values = dict.fromkeys(hostile_world["values"], value)
        url = path.format(**{**values, "path": value})
        response = getattr(client_for(hostile_world, path), method)(url)
        assert_refused(response, f"{method} {url}")
    assert fingerprint() == before, f"{method} {path}: something was stored"


def test_limit_is_clamped_and_a_huge_offset_is_400(hostile_world):
    client = hostile_world["user"]
    response = client.get(f"/api/v1/environments?limit={HUGE}")
    assert response.status_code == 200
    assert len(response.json()["results"]) >= 1
    assert_error(client.get(f"/api/v1/environments?offset={HUGE}"), 400, "invalid")
    assert_error(client.get("/api/v1/environments?limit=-5"), 400, "invalid")
    assert client.get("/api/v1/environments?offset=1000000").json()["results"] == []


def test_agent_labels_refuse_bidi_and_control_characters_naming_the_field(hostile_world):
    client = hostile_world["user"]
    agent_url = f"/api/v1/agents/{hostile_world['values']['agent_id']}"
    before = fingerprint()
    for labels in ({"role": "web\u202egpj.exe"}, {"ro\u200ble": "web"}, {"role": "a\nb"},
                   {"role\u2066": "x"}):
        response = client.patch(agent_url, {"labels": labels}, format="json")
        error = assert_error(response, 400, "invalid")
        assert error["details"][0]["field"].startswith("labels"), error
    assert fingerprint() == before
    response = client.patch(agent_url, {"labels": {"rôle": "wëb 1"}}, format="json")
    assert response.status_code == 200
    assert response.json()["labels"] == {"rôle": "wëb 1"}


def test_enroll_refuses_names_with_control_characters_and_stores_nothing(
        shared_world, hostile_world):
    environment = Environment.objects.get(pk=shared_world["environment"])
    _, secret = factories.enrollment_token(environment, uses=5)
    client = factories.api_client_for(None)
    before = fingerprint()
    for body in ({"enrollment_token": secret, "name": "web\u202e1"},
                 {"enrollment_token": secret, "name": "web\u00001"},
                 {"enrollment_token": secret, "name": "web", "labels": {"k\x00": "v"}}):
        response = client.post("/api/v1/agent/enroll", body, format="json")
        assert_error(response, 400)
    assert fingerprint() == before


def test_template_paths_with_bidi_or_zero_width_characters_are_400_and_store_nothing(
        hostile_world):
    client = hostile_world["user"]
    before = fingerprint()
    for path in ("etc/app\u202ecnf.exe", "etc/a\u200bpp.conf", "etc/app\u2028.conf"):
        url = f"/api/v1/environments/shop/prod/templates/{path}"
        response = client.put(url, {"source": "x\n"}, format="json")
        assert_error(response, 400)
    assert fingerprint() == before


def test_yaml_descriptors_with_nul_escapes_are_400(hostile_world):
    client = hostile_world["user"]
    body = ('apiVersion: bellwether/v1\napplication: shop\nenvironment: prod\nid: "r\\0"\n'
            'version: "1"\n')
    response = client.post("/api/v1/descriptors?dry_run=1", data=body,
                           content_type="application/yaml")
    assert_error(response, 400)


def test_nan_and_infinity_are_not_json(hostile_world):
    client = hostile_world["user"]
    before = fingerprint()
    for raw in ('{"config_schema": NaN}', '{"config_schema": {"a": Infinity}}'):
        response = client.patch("/api/v1/environments/shop/prod", data=raw,
                                content_type="application/json")
        assert_error(response, 400, "parse_error")
    assert fingerprint() == before


def test_failed_environment_patch_leaves_the_environment_readable(hostile_world):
    client = hostile_world["user"]
    response = client.patch("/api/v1/environments/shop/prod",
                            data='{"config": "a: 1\\n", "config_schema": {"\\ud800": 1}}',
                            content_type="application/json")
    assert_error(response, 400)
    assert client.get("/api/v1/environments/shop/prod").status_code == 200
    assert client.get("/api/v1/environments/shop/prod/agents").status_code == 200
    assert Environment.objects.get(name="prod", application__name="shop").config != "a: 1\n"


def test_nul_in_a_json_body_for_a_text_field_names_the_nested_field(hostile_world):
    response = hostile_world["user"].post(
        "/api/v1/environments/shop/prod/rollouts",
        data=json.dumps({"snapshot": 2, "canary_labels": {"role": "a\x00"}}),
        content_type="application/json")
    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "canary_labels.role"


# Header values arrive as bytes decoded as latin-1: every character is below U+0100.
@pytest.mark.parametrize("header", ["Bearer bwu_a\x00b.c", "Bearer bwa_\xff\xfe.x",
                                    "Bearer bwu_é.ü", "Bearer " + "9" * 5000,
                                    "Bearer bwa_1.\x85\x1b"])
@pytest.mark.parametrize("url", ["/api/v1/environments", "/api/v1/agent/desired"])
def test_hostile_authorization_headers_are_401_never_5xx(hostile_world, header, url):
    client = factories.bearer_client("x")
    client.credentials(HTTP_AUTHORIZATION=header)
    assert_error(client.get(url), 401)
