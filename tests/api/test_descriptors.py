"""POST /api/v1/descriptors: an app team's descriptor merged with the platform policy,
the environment's config and the tenant's restrictions, then published.

A submission publishes through transaction.on_commit, which never comes inside the
default test transaction: tests that expect the finished snapshot use transaction=True.
"""

import json
import re

import pytest
import yaml
from django.test import override_settings

from apps.audit.models import AuditEvent
from apps.environments.models import Descriptor
from apps.environments.services import environment_create, environment_file_put, policy_publish
from apps.releases.services import environment_update
from apps.snapshots.models import Publication, Snapshot
from apps.tenancy.models import Tenant
from tests.api.support import ENV
from tests.api_helpers import assert_error
from tests.factories import CONFIG, publish, rollback_publication

URL = "/api/v1/descriptors"
transactional = pytest.mark.django_db(transaction=True)

POLICY = {
    "descriptor_policy": {
        "params": ["feature", "cache_ttl"],
        "secret_refs": ["vault:secret/data/{application}/*"],
        "rollback": True,
    }
}
RESTRICTIONS = {"secret_refs": ["vault:secret/data/{application}/db*"]}

LAYERED_CONFIG = CONFIG + """params:
  dest_dir: /opt/shop
secrets:
  deploy_key: "vault:secret/data/shop/prod#ssh_key"
rollout:
  strategy: canary
  waves: [10, 100]
"""

RELEASE_TEMPLATE = """dest_dir = {{ params.dest_dir }}
feature = {{ params.feature | default("off") }}
{% for name, ref in secrets | dictsort %}secret {{ name }} = {{ ref }}
{% endfor %}"""

DB_PASSWORD = "vault:secret/data/shop/db#password"


def descriptor(**fields) -> dict:
    return {
        "apiVersion": "bellwether/v1",
        "application": "shop",
        "environment": "prod",
        "id": "rel-2.4.0",
        "version": "2.4.0",
        "params": {"feature": "on"},
        "secrets": {"db_password": DB_PASSWORD},
        "notes": "checkout fix",
        **fields,
    }


def as_yaml(value) -> str:
    return yaml.safe_dump(value, sort_keys=False)


def stored() -> dict:
    return {
        "publications": Publication.objects.count(),
        "snapshots": Snapshot.objects.count(),
        "descriptors": Descriptor.objects.count(),
        "audit_events": AuditEvent.objects.count(),
    }


NOTHING = {"publications": 0, "snapshots": 0, "descriptors": 0}


def descriptor_rows() -> dict:
    return {key: value for key, value in stored().items() if key != "audit_events"}


@pytest.fixture
def layered(environment, superuser):
    """shop/prod with params, a secret and a rollout, a template that shows the
    params and secrets, platform policy v1 and the tenant's restrictions."""
    policy_publish(content=POLICY, actor=superuser)
    Tenant.objects.filter(pk=environment.application.tenant_id).update(restrictions=RESTRICTIONS)
    env = environment_update(environment=environment, config=LAYERED_CONFIG, actor=superuser)
    environment_file_put(environment=env, kind="template", path="shop/release.conf",
                         text=RELEASE_TEMPLATE, actor=superuser)
    return env


@pytest.fixture
def deployer_client(api_client, member):
    return api_client(member("deployer"))


# --- who may submit ------------------------------------------------------------------


@transactional
@pytest.mark.parametrize("role", ["deployer", "owner"])
def test_deployer_or_owner_of_the_owning_tenant_publishes_a_descriptor(
    role, layered, api_client, member
):
    user = member(role)
    client = api_client(user)

    response = client.post(URL, descriptor(), format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["kind"], body["state"], body["environment"]) == ("publish", "ready", "shop/prod")
    assert body["snapshot"]["number"] == 1
    assert response["Location"] == f"{ENV}/snapshots/1"
    row = Descriptor.objects.get()
    assert (row.descriptor_id, row.content, row.submitted_by) == ("rel-2.4.0", descriptor(), user)
    assert str(row.publication_id) == body["id"]
    assert AuditEvent.objects.filter(action="publication.create",
                                     summary__contains="descriptor rel-2.4.0").exists()


def test_viewer_is_forbidden_and_nothing_is_stored(layered, api_client, member):
    client = api_client(member("viewer"))
    before = stored()

    response = client.post(URL, descriptor(), format="json")

    assert_error(response, 403, "permission_denied")
    assert stored() == before


@pytest.mark.parametrize("fields", [{}, {"params": {"dest_dir": "/leaked?"}}],
                         ids=["valid", "conflicting"])
def test_outsider_gets_404_learns_nothing_and_nothing_is_stored(
    fields, layered, api_client, outsider
):
    client = api_client(outsider)
    before = stored()

    response = client.post(URL, descriptor(**fields), format="json")

    error = assert_error(response, 404, "not_found")
    assert "details" not in error
    assert b"/opt/shop" not in response.content
    assert stored() == before


def test_deployer_cannot_submit_to_another_tenants_application(outsider, layered,
                                                              deployer_client):
    before = stored()

    response = deployer_client.post(URL, descriptor(application="blog"), format="json")

    assert_error(response, 404, "not_found")
    assert stored() == before


def test_anonymous_is_401_and_nothing_is_stored(layered, api_client):
    before = stored()

    response = api_client().post(URL, descriptor(), format="json")

    assert_error(response, 401, "not_authenticated")
    assert stored() == before


# --- bodies: JSON or YAML -------------------------------------------------------------


@transactional
@pytest.mark.parametrize("content_type", ["application/json", "application/yaml", "text/yaml"])
def test_json_and_yaml_bodies_publish_the_same_descriptor(content_type, layered,
                                                          deployer_client):
    body = json.dumps(descriptor()) if content_type == "application/json" \
        else as_yaml(descriptor())

    response = deployer_client.post(URL, body, content_type=content_type)

    assert response.status_code == 201, response.content
    snapshot = Snapshot.objects.get()
    assert snapshot.effective_config["params"] == {"dest_dir": "/opt/shop", "feature": "on"}
    assert Descriptor.objects.get().content == descriptor()


@transactional
def test_the_same_descriptor_as_yaml_after_json_is_a_repeat(layered, deployer_client):
    first = deployer_client.post(URL, descriptor(), format="json")
    before = stored()

    again = deployer_client.post(URL, as_yaml(descriptor()), content_type="application/yaml")

    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    assert stored() == before


# --- idempotency ----------------------------------------------------------------------


@transactional
def test_same_id_and_content_returns_the_same_snapshot_and_stores_nothing(
    layered, deployer_client, superuser
):
    first = deployer_client.post(URL, descriptor(), format="json")
    assert first.status_code == 201, first.content
    # The environment moves on; the repeat still answers the first publication.
    environment_update(environment=layered, config=LAYERED_CONFIG + "extra: 1\n",
                       actor=superuser)
    before = stored()

    again = deployer_client.post(URL, dict(reversed(descriptor().items())), format="json")

    assert again.status_code == 200, again.content
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["snapshot"] == first.json()["snapshot"]
    assert stored() == before


@transactional
@pytest.mark.parametrize("change", [{"version": "2.4.1"}, {"params": {"feature": "off"}},
                                    {"notes": "another note"}])
def test_same_id_with_other_content_is_409_and_stores_nothing(change, layered,
                                                              deployer_client):
    first = deployer_client.post(URL, descriptor(), format="json")
    assert first.status_code == 201, first.content
    before = stored()

    response = deployer_client.post(URL, descriptor(**change), format="json")

    error = assert_error(response, 409, "descriptor_conflict")
    assert "rel-2.4.0" in error["message"]
    assert stored() == before
    assert Descriptor.objects.get().content == descriptor()


@transactional
def test_a_refused_descriptor_does_not_reserve_its_id(layered, deployer_client):
    refused = deployer_client.post(URL, descriptor(params={"dest_dir": "/tmp"}), format="json")
    assert_error(refused, 400, "merge_conflict")

    accepted = deployer_client.post(URL, descriptor(), format="json")

    assert accepted.status_code == 201, accepted.content


@transactional
def test_the_same_id_may_be_used_in_another_environment(layered, deployer_client, superuser):
    environment_create(application=layered.application, name="staging",
                       config=LAYERED_CONFIG, actor=superuser)
    first = deployer_client.post(URL, descriptor(), format="json")

    other = deployer_client.post(URL, descriptor(environment="staging"), format="json")

    assert (first.status_code, other.status_code) == (201, 201), other.content
    assert Descriptor.objects.count() == 2


# --- dry run ---------------------------------------------------------------------------


def test_dry_run_answers_config_provenance_files_and_diff_and_records_nothing(
    layered, deployer_client, superuser
):
    active = publish(layered, superuser)
    before = stored()

    response = deployer_client.post(f"{URL}?dry_run=1", descriptor(), format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["valid"] is True and body["errors"] == []
    config = body["effective_config"]
    assert config["params"] == {"dest_dir": "/opt/shop", "feature": "on"}
    assert config["secrets"] == {
        "deploy_key": "${secret:vault:secret/data/shop/prod#ssh_key}",
        "db_password": "${secret:" + DB_PASSWORD + "}",
    }
    assert config["descriptor"] == {"id": "rel-2.4.0", "version": "2.4.0",
                                    "notes": "checkout fix"}
    provenance = body["provenance"]
    assert provenance["params.feature"] == "descriptor"
    assert provenance["secrets.db_password"] == "descriptor"
    assert provenance["params.dest_dir"] == "environment"
    assert provenance["secrets.deploy_key"] == "environment"
    assert provenance["rollout.strategy"] == "environment"
    assert provenance["workers"] == "environment"
    release = next(f for f in body["files"] if f["path"] == "shop/release.conf")
    assert "feature = on\n" in release["content"]
    # Templates see a sealed placeholder, listed in the bundle's secrets manifest.
    assert re.search(r"secret db_password = \$\{secret:sealed:[0-9a-f]{32}:"
                     + re.escape(DB_PASSWORD) + r"\}\n", release["content"])
    assert body["against"] == active.number
    assert [(d["path"], d["status"]) for d in body["diff"]] == [("shop/release.conf",
                                                                 "modified")]
    assert "-feature = off\n" in body["diff"][0]["diff"]
    assert "+feature = on\n" in body["diff"][0]["diff"]
    assert stored() == before


def test_dry_run_without_an_active_snapshot_diffs_against_nothing(layered, deployer_client):
    response = deployer_client.post(f"{URL}?dry_run=true", descriptor(), format="json")

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["against"] is None
    assert {d["status"] for d in body["diff"]} == {"added"}
    assert descriptor_rows() == NOTHING


def test_dry_run_needs_the_deployer_role(layered, api_client, member):
    response = api_client(member("viewer")).post(f"{URL}?dry_run=1", descriptor(),
                                                 format="json")

    assert_error(response, 403, "permission_denied")


@transactional
def test_dry_run_does_not_reserve_the_id(layered, deployer_client):
    deployer_client.post(f"{URL}?dry_run=1", descriptor(version="0.9"), format="json")

    response = deployer_client.post(URL, descriptor(), format="json")

    assert response.status_code == 201, response.content


# --- merge errors -----------------------------------------------------------------------


@pytest.mark.parametrize("query", ["", "?dry_run=1"], ids=["submit", "dry-run"])
def test_merge_errors_are_400_with_every_error_and_nothing_is_stored(
    query, layered, deployer_client
):
    before = stored()
    bad = descriptor(
        params={"dest_dir": "/srv/other", "post_command": "reboot"},
        secrets={"api_key": "hunter2-Sup3r-Secret"},
        rollout={"strategy": "all-at-once"},
        agents=["web-9"],
    )

    response = deployer_client.post(f"{URL}{query}", bad, format="json")

    error = assert_error(response, 400, "merge_conflict")
    details = {(d["layer"], d["key"]): d for d in error["details"]}
    assert set(details) == {
        ("descriptor", "params.dest_dir"),
        ("policy", "params.post_command"),
        ("descriptor", "secrets.api_key"),
        ("descriptor", "rollout"),
        ("descriptor", "agents"),
    }
    conflict = details[("descriptor", "params.dest_dir")]
    assert (conflict["environment_value"], conflict["descriptor_value"]) == (
        "/opt/shop", "/srv/other")
    assert details[("descriptor", "rollout")]["environment_value"] == {
        "strategy": "canary", "waves": [10, 100]}
    assert details[("policy", "params.post_command")]["descriptor_value"] == "reboot"
    assert "5 error(s)" in error["message"]
    assert b"hunter2-Sup3r-Secret" not in response.content
    assert stored() == before


@pytest.mark.parametrize(
    ("restrictions", "layer"),
    [({"secret_refs": ["vault:secret/data/{application}/cache*"]}, "tenant"),
     ({"secret_refs": ["*"]}, "policy")],
    ids=["tenant-narrows", "tenant-cannot-widen"],
)
def test_secret_references_are_held_to_policy_and_tenant(restrictions, layer, layered,
                                                         deployer_client):
    Tenant.objects.filter(pk=layered.application.tenant_id).update(restrictions=restrictions)
    reference = DB_PASSWORD if layer == "tenant" else "env:SHOP_DB_PASSWORD"

    response = deployer_client.post(URL, descriptor(secrets={"db_password": reference}),
                                    format="json")

    error = assert_error(response, 400, "merge_conflict")
    assert [(d["layer"], d["key"], d["descriptor_value"]) for d in error["details"]] == [
        (layer, "secrets.db_password", reference)]
    assert descriptor_rows() == NOTHING


def test_without_a_platform_policy_a_descriptor_adds_nothing(environment, deployer_client):
    response = deployer_client.post(URL, descriptor(secrets={}), format="json")

    error = assert_error(response, 400, "merge_conflict")
    assert [(d["layer"], d["key"]) for d in error["details"]] == [("policy", "params.feature")]


# --- malformed or hostile input -------------------------------------------------------

# Nine levels of ten aliases each: 5 * 10**9 strings once expanded.
BILLION_LAUGHS = (as_yaml(descriptor()) + 'lol0: &l0 ["lol", "lol", "lol", "lol", "lol"]\n'
                  + "".join(f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n"
                            for i in range(1, 10)))
DEEP_YAML = as_yaml({**descriptor(), "params": {}}).replace(
    "params: {}", "params:\n  feature: " + "[" * 40 + "]" * 40)


def _without(key: str) -> dict:
    value = descriptor()
    del value[key]
    return value


MALFORMED = [
    # (id, body, content type, status, code, text the message or details must contain)
    ("anchor-bomb", BILLION_LAUGHS, "application/yaml", 400, "parse_error",
     "expands to more than"),
    ("deep-yaml", DEEP_YAML, "text/yaml", 400, "parse_error", "nesting deeper than"),
    ("yaml-syntax", "apiVersion: bellwether/v1\napplication: shop\nid: rel: 1\n",
     "application/yaml", 400, "parse_error", "body:3"),
    ("yaml-unclosed", "apiVersion: bellwether/v1\nparams: {feature: on\n",
     "application/yaml", 400, "parse_error", "body:3"),
    ("yaml-duplicate-key", "id: a\napplication: shop\nid: b\n", "application/yaml", 400,
     "parse_error", "duplicate key 'id'"),
    ("yaml-tab", "id: a\nparams:\n\t- x\n", "application/yaml", 400, "parse_error", "body:3"),
    ("yaml-python-tag", "id: !!python/object/apply:os.system ['true']\n", "application/yaml",
     400, "parse_error", "body:1"),
    ("yaml-not-utf8", "id: caf\xe9\n".encode("latin-1"), "application/yaml", 400,
     "parse_error", "UTF-8"),
    ("yaml-integer-key", "1: one\n" + as_yaml(descriptor()), "application/yaml", 400,
     "parse_error", "keys must be strings"),
    ("json-syntax", '{"id": "rel-1",', "application/json", 400, "parse_error", "JSON"),
    ("json-nan", json.dumps(descriptor()).replace('"2.4.0"', "NaN"), "application/json", 400,
     None, "NaN"),
    ("unknown-api-version", json.dumps(descriptor(apiVersion="bellwether/v2")),
     "application/json", 400, "merge_conflict", "apiVersion"),
    ("params-a-list", json.dumps(descriptor(params=["feature"])), "application/json", 400,
     "merge_conflict", "params"),
    ("secrets-a-string", json.dumps(descriptor(secrets=DB_PASSWORD)), "application/json",
     400, "merge_conflict", "secrets"),
    ("id-missing", json.dumps(_without("id")), "application/json", 400,
     "descriptor_invalid", "id"),
    ("id-with-spaces", json.dumps(descriptor(id="release 2.4.0")), "application/json", 400,
     "descriptor_invalid", "id"),
    ("id-too-long", json.dumps(descriptor(id="r" * 129)), "application/json", 400,
     "descriptor_invalid", "id"),
    ("id-a-number", json.dumps(descriptor(id=240)), "application/json", 400,
     "descriptor_invalid", "id"),
    ("version-a-mapping", json.dumps(descriptor(version={"major": 2})), "application/json",
     400, "descriptor_invalid", "version"),
    ("notes-a-list", json.dumps(descriptor(notes=["a"])), "application/json", 400,
     "descriptor_invalid", "notes"),
    ("application-missing", json.dumps(_without("application")), "application/json", 400,
     "descriptor_invalid", "application"),
    ("body-a-list", json.dumps([descriptor()]), "application/json", 400,
     "descriptor_invalid", "mapping"),
    ("body-a-number", "5", "application/json", 400, "descriptor_invalid", "mapping"),
    ("body-null", "null", "application/json", 400, "descriptor_invalid", "mapping"),
    ("yaml-a-scalar", "just some text\n", "application/yaml", 400, "descriptor_invalid",
     "mapping"),
    ("yaml-a-list", as_yaml([descriptor()]), "text/yaml", 400, "descriptor_invalid",
     "mapping"),
    ("body-empty", "", "application/yaml", 400, "descriptor_invalid", "required"),
    ("unsupported-media-type", json.dumps(descriptor()), "text/plain", 415,
     "unsupported_media_type", "text/plain"),
]


@pytest.mark.parametrize(("body", "content_type", "status", "code", "named"),
                         [row[1:] for row in MALFORMED], ids=[row[0] for row in MALFORMED])
def test_malformed_or_hostile_input_is_refused_naming_the_problem_and_stores_nothing(
    body, content_type, status, code, named, layered, deployer_client
):
    before = stored()

    response = deployer_client.post(URL, body, content_type=content_type)

    error = assert_error(response, status, code)
    assert named in error["message"] + json.dumps(error.get("details", [])), error
    assert stored() == before


def test_yaml_over_the_config_size_limit_is_400_naming_the_size(layered, deployer_client,
                                                                 settings):
    settings.BELLWETHER_LIMITS = {**settings.BELLWETHER_LIMITS, "max_config_bytes": 1024}
    body = as_yaml(descriptor(notes="x" * 2000))

    response = deployer_client.post(URL, body, content_type="application/yaml")

    error = assert_error(response, 400, "parse_error")
    assert "the limit is 1024" in error["message"]
    assert descriptor_rows() == NOTHING


def test_json_body_over_the_upload_limit_is_413_and_stores_nothing(layered, deployer_client):
    body = json.dumps(descriptor(notes="x" * 2000))
    before = stored()

    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        response = deployer_client.post(URL, body, content_type="application/json")

    assert_error(response, 413, "too_large")
    assert stored() == before


@pytest.mark.parametrize("content_type", ["application/yaml", "text/yaml"])
def test_yaml_body_over_the_upload_limit_is_413_and_stores_nothing(content_type, layered,
                                                                   deployer_client):
    body = as_yaml(descriptor(notes="x" * 2000))
    before = stored()

    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1024):
        response = deployer_client.post(URL, body, content_type=content_type)

    assert_error(response, 413, "too_large")
    assert stored() == before


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


HOSTILE_JSON = [
    # (id, JSON text put in place of params.feature, what the message must name)
    ("nested-40", _deep(40), "nest"),
    ("nested-500", _deep(500), "nest"),
    ("nested-100000", _deep(100_000), "nest"),
    ("nul-character", '"a\\u0000b"', "nul"),
    ("infinite-number", "1e400", "infinity"),
]


@pytest.mark.parametrize(("value", "named"), [row[1:] for row in HOSTILE_JSON],
                         ids=[row[0] for row in HOSTILE_JSON])
def test_hostile_json_values_are_400_naming_the_problem_and_store_nothing(
    value, named, layered, deployer_client
):
    body = json.dumps(descriptor(params={"feature": "HOSTILE"})).replace('"HOSTILE"', value)
    before = stored()

    response = deployer_client.post(URL, body, content_type="application/json")

    error = assert_error(response, 400)
    assert named in error["message"].lower(), error
    assert stored() == before


# --- what a descriptor snapshot records ---------------------------------------------


@transactional
def test_stored_source_holds_the_descriptor_and_every_layer_used(layered, deployer_client):
    response = deployer_client.post(URL, descriptor(), format="json")
    assert response.status_code == 201, response.content

    snapshot = Snapshot.objects.get()
    source = snapshot.source
    assert source["descriptor"] == descriptor()
    assert source["config"] == LAYERED_CONFIG
    assert source["policy"] == {"version": 1, "content": POLICY}
    assert source["tenant_restrictions"] == RESTRICTIONS
    assert Publication.objects.get().source == source
    assert snapshot.provenance["params.feature"] == "descriptor"
    assert snapshot.provenance["params.dest_dir"] == "environment"
    detail = deployer_client.get(f"{ENV}/snapshots/1").json()
    assert detail["source"] == source
    assert detail["effective_config"]["descriptor"]["version"] == "2.4.0"


@transactional
def test_rollback_re_renders_a_descriptor_snapshot_from_its_frozen_layers(
    layered, deployer_client, superuser
):
    response = deployer_client.post(URL, descriptor(), format="json")
    assert response.status_code == 201, response.content
    made = Snapshot.objects.get(number=1)
    # Every layer changes: a stricter policy, a tenant allowing no secret, a new config.
    policy_publish(content={"descriptor_policy": {"params": [], "secret_refs": []}},
                   actor=superuser)
    Tenant.objects.filter(pk=layered.application.tenant_id).update(
        restrictions={"secret_refs": []})
    environment_update(environment=layered, actor=superuser,
                       config=LAYERED_CONFIG.replace("/opt/shop", "/srv/shop"))
    today = deployer_client.post(f"{URL}?dry_run=1", descriptor(id="rel-again"), format="json")
    assert {(d["layer"], d["key"]) for d in assert_error(today, 400, "merge_conflict")[
        "details"]} == {("policy", "params.feature"), ("policy", "secrets.db_password")}
    changed = publish(layered, superuser)
    assert changed.files != made.files

    rolled_back = rollback_publication(made, superuser).snapshot

    assert rolled_back.number == 3 and rolled_back.rolled_back_from == made
    assert rolled_back.state == "ready"
    assert rolled_back.files == made.files
    assert rolled_back.checksum == made.checksum
    assert rolled_back.effective_config == made.effective_config
    assert rolled_back.provenance == made.provenance
    assert rolled_back.source == made.source
    assert rolled_back.source["policy"]["version"] == 1


@transactional
def test_snapshot_detail_shows_provenance(layered, deployer_client):
    response = deployer_client.post(URL, descriptor(), format="json")
    assert response.status_code == 201, response.content

    detail = deployer_client.get(f"{ENV}/snapshots/1").json()

    assert detail["provenance"]["params.feature"] == "descriptor"
    assert detail["provenance"]["secrets.db_password"] == "descriptor"
    assert detail["provenance"]["params.dest_dir"] == "environment"


@transactional
def test_a_descriptor_is_frozen_into_a_snapshot_of_its_own_even_with_identical_files(
        layered, deployer_client):
    first = deployer_client.post(URL, descriptor(id="build-1"), format="json").json()
    # Another release id, same content: the files render identically.
    response = deployer_client.post(URL, descriptor(id="build-2"), format="json")

    assert response.status_code == 201
    second = response.json()["snapshot"]
    assert second["number"] == first["snapshot"]["number"] + 1
    assert second["checksum"] == first["snapshot"]["checksum"]
    assert Snapshot.objects.get(number=second["number"]).source["descriptor"]["id"] == "build-2"


def test_preview_shows_provenance(layered, deployer_client):
    body = deployer_client.get("/api/v1/environments/shop/prod/preview").json()

    assert body["provenance"]
    assert set(body["provenance"].values()) == {"environment"}
