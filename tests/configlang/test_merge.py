"""The pure merge of platform policy, environment, tenant and descriptor.

No database: `merge` takes plain dicts. One table row per row of the seed's field
table, adapted to Bellwether: params, secrets, rollback, rollout, the sections that
belong to the environment alone (agents, fallback, in place of the seed's traffic
and targets), and the descriptor's own metadata (id, version, notes).
"""

import copy
import json

import pytest

from configlang.merge import API_VERSION, MergeError, merge, secret_placeholder

APP, ENV_NAME = "shop", "prod"
ABSENT = object()  # "this value is not part of the error"

POLICY = {
    "descriptor_policy": {
        "params": ["feature", "cache_ttl", "db"],
        "secret_refs": [
            "vault:secret/data/{application}/*",
            "env:SHOP_*",
            "file:/etc/{application}/{environment}/*",
        ],
        "rollback": True,
    }
}

DEPLOY_KEY = "vault:secret/data/shop/prod#ssh_key"

ENVIRONMENT = {
    "listen": 80,
    "params": {
        "dest_dir": "/opt/shop",
        "layout": "releases",
        "workers": 4,
        "debug": False,
        "db": {"host": "db.internal", "port": 5432},
        "tls": {"cert": "/etc/tls/shop.pem"},
    },
    "secrets": {"deploy_key": DEPLOY_KEY},
    "rollout": {"strategy": "canary", "waves": [10, 100]},
    "rollback": {"enabled": True},
    "agents": {"labels": {"az": "eu-1a"}},
    "fallback": {"page": "maintenance.html"},
}


def descriptor(**fields) -> dict:
    return {"apiVersion": API_VERSION, "application": APP, "environment": ENV_NAME,
            "id": "rel-1", **fields}


def run(desc, *, environment=None, policy=POLICY, tenant=None):
    return merge(environment=copy.deepcopy(ENVIRONMENT if environment is None else environment),
                 policy=policy, tenant=tenant, descriptor=desc, application=APP,
                 environment_name=ENV_NAME)


def at(config: dict, path: str):
    value = config
    for part in path.split("."):
        value = value[part]
    return value


def leaf_paths(value, path: str = "") -> set[str]:
    """Dotted paths of the leaves (scalars, lists, empty mappings) below the root."""
    if isinstance(value, dict) and (value or not path):
        out: set[str] = set()
        for key, child in value.items():
            out |= leaf_paths(child, f"{path}.{key}" if path else key)
        return out
    return {path}


def only_error(merged) -> dict:
    assert len(merged.errors) == 1, [str(e) for e in merged.errors]
    return merged.errors[0].as_dict()


def error_keys(merged) -> set[tuple[str, str]]:
    return {(e.layer, e.path) for e in merged.errors}


# --- the field table: what the descriptor may do with each field --------------------

ACCEPTED = [
    # (row, descriptor fields, key path, effective value, layer that set it)
    ("params: environment defines, descriptor omits", {},
     "params.dest_dir", "/opt/shop", "environment"),
    ("params: descriptor adds a key the policy allows", {"params": {"feature": "on"}},
     "params.feature", "on", "descriptor"),
    ("params: descriptor repeats an identical value", {"params": {"dest_dir": "/opt/shop"}},
     "params.dest_dir", "/opt/shop", "environment"),
    ("params: descriptor repeats a key the policy does not list",
     {"params": {"layout": "releases", "workers": 4}}, "params.workers", 4, "environment"),
    ("params: nested identical repeat", {"params": {"db": {"host": "db.internal"}}},
     "params.db.host", "db.internal", "environment"),
    ("params: nested addition under an allowed key", {"params": {"db": {"pool": 10}}},
     "params.db.pool", 10, "descriptor"),
    ("params: a new allowed mapping", {"params": {"cache_ttl": {"default": 60}}},
     "params.cache_ttl.default", 60, "descriptor"),
    ("secrets: environment declares, descriptor omits", {},
     "secrets.deploy_key", secret_placeholder(DEPLOY_KEY), "environment"),
    ("secrets: descriptor repeats the identical reference",
     {"secrets": {"deploy_key": DEPLOY_KEY}},
     "secrets.deploy_key", secret_placeholder(DEPLOY_KEY), "environment"),
    ("secrets: vault reference under {application}",
     {"secrets": {"db_password": "vault:secret/data/shop/db#password"}},
     "secrets.db_password", "${secret:vault:secret/data/shop/db#password}", "descriptor"),
    ("secrets: env reference the policy allows", {"secrets": {"token": "env:SHOP_TOKEN"}},
     "secrets.token", "${secret:env:SHOP_TOKEN}", "descriptor"),
    ("secrets: file reference under {application}/{environment}",
     {"secrets": {"cert": "file:/etc/shop/prod/cert.pem"}},
     "secrets.cert", "${secret:file:/etc/shop/prod/cert.pem}", "descriptor"),
    ("rollback: environment imposes, descriptor omits", {},
     "rollback.enabled", True, "environment"),
    ("rollback: environment imposes, descriptor repeats it", {"rollback": {"enabled": True}},
     "rollback.enabled", True, "environment"),
    ("rollout: descriptor omits", {}, "rollout.strategy", "canary", "environment"),
    ("rollout: descriptor repeats it identically",
     {"rollout": {"strategy": "canary", "waves": [10, 100]}},
     "rollout.waves", [10, 100], "environment"),
    ("agents: environment defines, descriptor omits", {},
     "agents.labels.az", "eu-1a", "environment"),
    ("fallback: environment defines, descriptor omits", {},
     "fallback.page", "maintenance.html", "environment"),
    ("metadata: id", {}, "descriptor.id", "rel-1", "descriptor"),
    ("metadata: version", {"version": "2.4.0"}, "descriptor.version", "2.4.0", "descriptor"),
    ("metadata: notes", {"notes": "hotfix for checkout"},
     "descriptor.notes", "hotfix for checkout", "descriptor"),
]


@pytest.mark.parametrize(("fields", "path", "value", "layer"),
                         [row[1:] for row in ACCEPTED], ids=[row[0] for row in ACCEPTED])
def test_field_table_accepted_rows_merge_with_their_provenance(fields, path, value, layer):
    merged = run(descriptor(**fields))

    assert merged.errors == []
    assert at(merged.config, path) == value
    assert merged.provenance[path] == layer


REFUSED = [
    # (row, descriptor fields, layer, key path, environment value, descriptor value)
    ("params: descriptor differs", {"params": {"dest_dir": "/tmp/shop"}},
     "descriptor", "params.dest_dir", "/opt/shop", "/tmp/shop"),
    ("params: the same number as a string", {"params": {"workers": "4"}},
     "descriptor", "params.workers", 4, "4"),
    ("params: 0 is not false", {"params": {"debug": 0}},
     "descriptor", "params.debug", False, 0),
    ("params: nested value differs", {"params": {"db": {"port": 6432}}},
     "descriptor", "params.db.port", 5432, 6432),
    ("params: a scalar where the environment has a mapping", {"params": {"db": "pg://x"}},
     "descriptor", "params.db", {"host": "db.internal", "port": 5432}, "pg://x"),
    ("params: added key the policy does not allow", {"params": {"post_command": "rm -rf /"}},
     "policy", "params.post_command", ABSENT, "rm -rf /"),
    ("params: nested addition under a key the policy does not list",
     {"params": {"tls": {"key": "/etc/tls/shop.key"}}},
     "policy", "params.tls.key", ABSENT, "/etc/tls/shop.key"),
    ("params: not a mapping", {"params": ["feature"]},
     "descriptor", "params", ABSENT, ["feature"]),
    ("secrets: another reference for a declared name",
     {"secrets": {"deploy_key": "vault:secret/data/shop/prod#other"}},
     "descriptor", "secrets.deploy_key", DEPLOY_KEY, "vault:secret/data/shop/prod#other"),
    ("secrets: reference of another application",
     {"secrets": {"db_password": "vault:secret/data/blog/db#password"}},
     "policy", "secrets.db_password", ABSENT, "vault:secret/data/blog/db#password"),
    ("secrets: env reference outside the policy's prefix",
     {"secrets": {"token": "env:BLOG_TOKEN"}},
     "policy", "secrets.token", ABSENT, "env:BLOG_TOKEN"),
    ("secrets: file reference of another environment",
     {"secrets": {"cert": "file:/etc/shop/staging/cert.pem"}},
     "policy", "secrets.cert", ABSENT, "file:/etc/shop/staging/cert.pem"),
    ("secrets: not a mapping", {"secrets": "vault:secret/data/shop/db#password"},
     "descriptor", "secrets", ABSENT, "vault:secret/data/shop/db#password"),
    ("rollback: turned off where the environment imposes it", {"rollback": {"enabled": False}},
     "descriptor", "rollback.enabled", True, False),
    ("rollout: a different strategy", {"rollout": {"strategy": "all-at-once"}},
     "descriptor", "rollout", {"strategy": "canary", "waves": [10, 100]},
     {"strategy": "all-at-once"}),
    ("rollout: the same strategy with other waves",
     {"rollout": {"strategy": "canary", "waves": [50, 100]}},
     "descriptor", "rollout", {"strategy": "canary", "waves": [10, 100]},
     {"strategy": "canary", "waves": [50, 100]}),
    ("agents: even an identical repeat", {"agents": {"labels": {"az": "eu-1a"}}},
     "descriptor", "agents", ABSENT, {"labels": {"az": "eu-1a"}}),
    ("fallback: any value", {"fallback": {"page": "sorry.html"}},
     "descriptor", "fallback", ABSENT, {"page": "sorry.html"}),
]


@pytest.mark.parametrize(("fields", "layer", "key", "environment_value", "descriptor_value"),
                         [row[1:] for row in REFUSED], ids=[row[0] for row in REFUSED])
def test_field_table_refused_rows_name_layer_key_and_both_values(
    fields, layer, key, environment_value, descriptor_value
):
    merged = run(descriptor(**fields))

    error = only_error(merged)
    assert (error["layer"], error["key"]) == (layer, key)
    assert error["message"]
    if environment_value is ABSENT:
        assert "environment_value" not in error
    else:
        assert error["environment_value"] == environment_value
    assert error["descriptor_value"] == descriptor_value
    assert error["code"] == ("merge_refused" if environment_value is ABSENT
                             else "merge_conflict")
    # Nothing was overridden: the environment's values stand.
    for path in leaf_paths(ENVIRONMENT):
        if not path.startswith("secrets."):
            assert at(merged.config, path) == at(ENVIRONMENT, path)


def test_a_refused_addition_is_left_out_of_the_effective_config():
    merged = run(descriptor(params={"post_command": "rm -rf /", "feature": "on"},
                            secrets={"other": "vault:secret/data/blog/x#y"}))

    assert error_keys(merged) == {("policy", "params.post_command"), ("policy", "secrets.other")}
    assert "post_command" not in merged.config["params"]
    assert merged.config["params"]["feature"] == "on"
    assert "other" not in merged.config["secrets"]


# --- rollback: on within policy, never off where the environment imposes it ----------


NOT_IMPOSED = {**ENVIRONMENT, "rollback": {"keep": 3}}


def test_descriptor_turns_rollback_on_when_the_policy_allows_it():
    merged = run(descriptor(rollback={"enabled": True}), environment=NOT_IMPOSED)

    assert merged.errors == []
    assert merged.config["rollback"] == {"keep": 3, "enabled": True}
    assert merged.provenance["rollback.enabled"] == "descriptor"
    assert merged.provenance["rollback.keep"] == "environment"


def test_descriptor_turns_rollback_on_where_the_environment_leaves_it_off():
    environment = {**ENVIRONMENT, "rollback": {"enabled": False}}

    merged = run(descriptor(rollback={"enabled": True}), environment=environment)

    assert merged.errors == []
    assert merged.config["rollback"] == {"enabled": True}
    assert merged.provenance["rollback.enabled"] == "descriptor"


@pytest.mark.parametrize("rollback_policy", [False, None, "yes"],
                         ids=["policy-false", "policy-unset", "policy-not-a-bool"])
def test_descriptor_cannot_turn_rollback_on_beyond_the_policy(rollback_policy):
    rules = {**POLICY["descriptor_policy"], "rollback": rollback_policy}
    if rollback_policy is None:
        del rules["rollback"]

    merged = run(descriptor(rollback={"enabled": True}), environment=NOT_IMPOSED,
                 policy={"descriptor_policy": rules})

    error = only_error(merged)
    assert (error["layer"], error["key"], error["descriptor_value"]) == (
        "policy", "rollback.enabled", True)
    assert merged.config["rollback"] == {"keep": 3}


def test_descriptor_leaving_rollback_off_where_not_imposed_changes_nothing():
    merged = run(descriptor(rollback={"enabled": False}), environment=NOT_IMPOSED)

    assert merged.errors == []
    assert merged.config["rollback"] == {"keep": 3}


@pytest.mark.parametrize("rollback", [True, "on", {"enabled": "yes"}, {"enabled": 1},
                                      {"enabled": True, "keep": 5}, {}])
def test_malformed_descriptor_rollback_is_refused(rollback):
    merged = run(descriptor(rollback=rollback), environment=NOT_IMPOSED)

    error = only_error(merged)
    assert (error["layer"], error["key"], error["descriptor_value"]) == (
        "descriptor", "rollback", rollback)
    assert merged.config["rollback"] == {"keep": 3}


# --- rollout, environment-only sections, the descriptor's own fields ------------------


def test_rollout_in_a_descriptor_is_refused_when_the_environment_has_none():
    environment = {k: v for k, v in ENVIRONMENT.items() if k != "rollout"}

    merged = run(descriptor(rollout={"strategy": "canary"}), environment=environment)

    error = only_error(merged)
    assert (error["layer"], error["key"], error["descriptor_value"]) == (
        "descriptor", "rollout", {"strategy": "canary"})
    assert "rollout" not in merged.config


@pytest.mark.parametrize("field", ["schedule", "callbacks", "steps", "artifact", "listen"])
def test_unknown_descriptor_fields_are_refused(field):
    merged = run(descriptor(**{field: {"x": 1}}))

    error = only_error(merged)
    assert (error["layer"], error["key"]) == ("descriptor", field)
    assert merged.config.get(field) == ENVIRONMENT.get(field)


@pytest.mark.parametrize("api_version", ["manent/v1", "bellwether/v2", "", None, 1])
def test_wrong_api_version_is_refused(api_version):
    merged = run(descriptor(apiVersion=api_version))

    error = only_error(merged)
    assert (error["layer"], error["key"], error["descriptor_value"]) == (
        "descriptor", "apiVersion", api_version)
    assert "bellwether/v1" in error["message"]


def test_missing_api_version_is_refused():
    desc = descriptor()
    del desc["apiVersion"]

    error = only_error(run(desc))

    assert (error["layer"], error["key"]) == ("descriptor", "apiVersion")


@pytest.mark.parametrize(("field", "value"), [("application", "blog"),
                                              ("environment", "staging"),
                                              ("environment", None)])
def test_descriptor_for_another_application_or_environment_is_refused(field, value):
    merged = run(descriptor(**{field: value}))

    error = only_error(merged)
    assert (error["layer"], error["key"], error["descriptor_value"]) == (
        "descriptor", field, value)


def test_environment_may_not_define_the_descriptor_section():
    environment = {**ENVIRONMENT, "descriptor": {"id": "forged"}}

    error = only_error(run(descriptor(), environment=environment))

    assert (error["layer"], error["key"], error["environment_value"]) == (
        "environment", "descriptor", {"id": "forged"})


def test_all_errors_are_reported_together():
    merged = run(descriptor(
        apiVersion="manent/v1",
        params={"dest_dir": "/tmp", "post_command": "reboot"},
        secrets={"api_key": "hunter2-literal"},
        agents=["web-1"],
    ))

    assert len(merged.errors) == 5
    assert error_keys(merged) == {
        ("descriptor", "apiVersion"),
        ("descriptor", "params.dest_dir"),
        ("policy", "params.post_command"),
        ("descriptor", "secrets.api_key"),
        ("descriptor", "agents"),
    }
    assert all(isinstance(e, MergeError) and str(e).startswith(f"{e.layer}: {e.path}: ")
               for e in merged.errors)


# --- secrets: references only ----------------------------------------------------------

LITERALS = ["hunter2-Sup3r-Secret", "correct horse battery staple", "s3cr3t#value",
            "postgres://app:pa55word@db/shop"]
MALFORMED_REFERENCES = ["env:", "env:1BAD", "env:HAS SPACE", "file:relative/path", "file:",
                        "vault:secret/data/shop/db", "vault:a#b#c", "vault:#key",
                        " env:SHOP_TOKEN", "ENV:SHOP_TOKEN", "${secret:env:SHOP_TOKEN}"]


@pytest.mark.parametrize("literal", LITERALS)
def test_a_literal_secret_in_a_descriptor_is_refused_and_never_echoed(literal):
    permissive = {"descriptor_policy": {"secret_refs": ["*"]}}

    merged = run(descriptor(secrets={"api_key": literal}), policy=permissive)

    error = only_error(merged)
    assert (error["layer"], error["key"]) == ("descriptor", "secrets.api_key")
    assert "reference" in error["message"]
    assert "descriptor_value" not in error and "environment_value" not in error
    assert literal not in json.dumps(error) and literal not in str(merged.errors[0])
    assert literal not in json.dumps(merged.config)
    assert "secrets.api_key" not in merged.provenance


@pytest.mark.parametrize("reference", MALFORMED_REFERENCES)
def test_a_malformed_reference_counts_as_a_literal(reference):
    permissive = {"descriptor_policy": {"secret_refs": ["*"]}}

    merged = run(descriptor(secrets={"api_key": reference}), policy=permissive)

    error = only_error(merged)
    assert (error["layer"], error["key"]) == ("descriptor", "secrets.api_key")
    assert "descriptor_value" not in error
    assert "api_key" not in merged.config["secrets"]


@pytest.mark.parametrize("value", [42, None, True, ["env:SHOP_TOKEN"], {"ref": "env:SHOP_X"}])
def test_a_secret_that_is_not_a_string_is_refused(value):
    permissive = {"descriptor_policy": {"secret_refs": ["*"]}}

    error = only_error(run(descriptor(secrets={"api_key": value}), policy=permissive))

    assert (error["layer"], error["key"]) == ("descriptor", "secrets.api_key")


@pytest.mark.parametrize("reference", ["env:SHOP_TOKEN", "env:_private", "file:/run/secrets/tok",
                                       "vault:secret/data/shop/db#password",
                                       "vault:kv/shop#api-key"])
def test_env_file_and_vault_references_are_accepted(reference):
    permissive = {"descriptor_policy": {"secret_refs": ["*"]}}

    merged = run(descriptor(secrets={"api_key": reference}), policy=permissive)

    assert merged.errors == []
    assert merged.config["secrets"]["api_key"] == "${secret:" + reference + "}"


def test_a_literal_secret_in_the_environment_is_refused_without_echoing_it():
    environment = {**ENVIRONMENT, "secrets": {"deploy_key": "hunter2-Sup3r-Secret"}}

    merged = run(None, environment=environment)

    error = only_error(merged)
    assert (error["layer"], error["key"]) == ("environment", "secrets.deploy_key")
    assert "hunter2-Sup3r-Secret" not in json.dumps(error)


def test_without_secret_refs_in_the_policy_a_descriptor_adds_no_secret():
    policy = {"descriptor_policy": {"params": ["feature"]}}

    merged = run(descriptor(secrets={"token": "env:SHOP_TOKEN",
                                     "deploy_key": DEPLOY_KEY}), policy=policy)

    # The repeat of a declared secret is fine; the addition is not.
    assert error_keys(merged) == {("policy", "secrets.token")}


def test_secrets_become_placeholders_in_the_effective_config():
    merged = run(descriptor(secrets={"token": "env:SHOP_TOKEN",
                                     "db": "vault:secret/data/shop/db#password"}))

    assert merged.errors == []
    assert merged.config["secrets"] == {
        "deploy_key": "${secret:vault:secret/data/shop/prod#ssh_key}",
        "token": "${secret:env:SHOP_TOKEN}",
        "db": "${secret:vault:secret/data/shop/db#password}",
    }
    assert secret_placeholder("env:X") == "${secret:env:X}"


# --- the tenant restricts, never adds ------------------------------------------------

TENANT = {"secret_refs": ["vault:secret/data/{application}/public/*"]}


def test_tenant_restriction_admits_references_within_it():
    merged = run(descriptor(secrets={"cdn": "vault:secret/data/shop/public/cdn#key"}),
                 tenant=TENANT)

    assert merged.errors == []
    assert merged.provenance["secrets.cdn"] == "descriptor"


def test_tenant_restriction_refuses_what_the_policy_alone_would_allow():
    merged = run(descriptor(secrets={"db": "vault:secret/data/shop/db#password"}),
                 tenant=TENANT)

    error = only_error(merged)
    assert (error["layer"], error["key"], error["descriptor_value"]) == (
        "tenant", "secrets.db", "vault:secret/data/shop/db#password")
    assert "db" not in merged.config["secrets"]


@pytest.mark.parametrize("tenant_patterns", [["*"], ["env:*"], ["vault:secret/data/blog/*"]])
def test_tenant_never_widens_the_policy(tenant_patterns):
    merged = run(descriptor(secrets={"token": "env:BLOG_TOKEN",
                                     "other": "vault:secret/data/blog/db#pw"}),
                 tenant={"secret_refs": tenant_patterns})

    assert error_keys(merged) == {("policy", "secrets.token"), ("policy", "secrets.other")}


def test_tenant_with_no_allowed_references_refuses_every_addition_but_not_repeats():
    merged = run(descriptor(secrets={"token": "env:SHOP_TOKEN", "deploy_key": DEPLOY_KEY}),
                 tenant={"secret_refs": []})

    assert error_keys(merged) == {("tenant", "secrets.token")}
    assert merged.config["secrets"] == {"deploy_key": secret_placeholder(DEPLOY_KEY)}


def test_tenant_placeholders_are_filled_in_like_the_policys():
    tenant = {"secret_refs": ["file:/etc/{application}/{environment}/public/*"]}

    accepted = run(descriptor(secrets={"a": "file:/etc/shop/prod/public/a"}), tenant=tenant)
    refused = run(descriptor(secrets={"a": "file:/etc/shop/prod/private/a"}), tenant=tenant)

    assert accepted.errors == []
    assert error_keys(refused) == {("tenant", "secrets.a")}


def test_tenant_cannot_add_params_or_rollback():
    tenant = {"params": ["post_command"], "rollback": True, "secret_refs": ["*"]}
    policy = {"descriptor_policy": {"params": ["feature"], "secret_refs": ["env:SHOP_*"]}}

    merged = run(descriptor(params={"post_command": "reboot"}, rollback={"enabled": True}),
                 environment=NOT_IMPOSED, policy=policy, tenant=tenant)

    assert error_keys(merged) == {("policy", "params.post_command"), ("policy", "rollback.enabled")}


# --- provenance, purity --------------------------------------------------------------


def test_provenance_names_the_layer_of_every_leaf():
    merged = run(descriptor(version="2.4.0", notes="n", params={"feature": "on",
                                                                "db": {"pool": 5}},
                            secrets={"token": "env:SHOP_TOKEN"}))

    assert merged.errors == []
    assert set(merged.provenance) == leaf_paths(merged.config)
    descriptor_set = {path for path, layer in merged.provenance.items() if layer == "descriptor"}
    assert descriptor_set == {"params.feature", "params.db.pool", "secrets.token",
                              "descriptor.id", "descriptor.version", "descriptor.notes"}
    assert set(merged.provenance.values()) == {"environment", "descriptor"}
    assert list(merged.provenance) == sorted(merged.provenance)


def test_without_a_descriptor_everything_comes_from_the_environment():
    merged = run(None)

    assert merged.errors == []
    assert "descriptor" not in merged.config
    assert set(merged.provenance) == leaf_paths(ENVIRONMENT)
    assert set(merged.provenance.values()) == {"environment"}
    assert merged.config["secrets"] == {"deploy_key": secret_placeholder(DEPLOY_KEY)}


def test_merge_does_not_change_its_inputs():
    environment, policy = copy.deepcopy(ENVIRONMENT), copy.deepcopy(POLICY)
    tenant = copy.deepcopy(TENANT)
    desc = descriptor(params={"feature": "on", "db": {"pool": 5}},
                      secrets={"c": "vault:secret/data/shop/public/c#k"})
    before = copy.deepcopy((environment, policy, tenant, desc))

    merged = merge(environment=environment, policy=policy, tenant=tenant, descriptor=desc,
                   application=APP, environment_name=ENV_NAME)

    assert merged.errors == []
    assert (environment, policy, tenant, desc) == before
    merged.config["params"]["db"]["pool"] = 99
    assert desc["params"]["db"]["pool"] == 5


def test_environment_secrets_in_the_wrong_shape_are_reported_not_raised():
    environment = {**ENVIRONMENT, "secrets": [{"name": "deploy_key", "ref": DEPLOY_KEY}]}

    merged = run(descriptor(secrets={"token": "env:SHOP_TOKEN"}), environment=environment)

    assert ("environment", "secrets") in error_keys(merged)


@pytest.mark.parametrize(("environment", "fields"), [
    ({}, {"version": "1"}),
    ({"listen": 80}, {"version": "1", "secrets": {}}),
    ({"listen": 80}, {"version": "1", "params": {}}),
], ids=["empty-environment", "empty-secrets", "empty-params"])
def test_provenance_names_exactly_the_keys_of_the_effective_config(environment, fields):
    merged = run(descriptor(**fields), environment=environment)

    assert merged.errors == []
    assert set(merged.provenance) == leaf_paths(merged.config)
