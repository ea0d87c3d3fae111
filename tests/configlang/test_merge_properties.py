"""Properties of the pure merge, checked with Hypothesis. No database.

- A value the environment defines is never changed by a descriptor: the effective
  config keeps it at the same path, or the merge reports an error.
- The merge is deterministic and does not depend on key order.
- A tenant restriction never widens what the platform policy allows.
"""

import copy
import json
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from configlang.merge import API_VERSION, merge, secret_placeholder

APP, ENV_NAME = "shop", "prod"

PROPERTY_SETTINGS = settings(suppress_health_check=[HealthCheck.too_slow])

KEYS = ["a", "b", "db", "feature", "dest_dir", "port"]
# Values that compare equal across types (0, 0.0, False) must still never override.
SCALARS = st.one_of(st.none(), st.sampled_from([0, 0.0, 1, 1.0, True, False, 4, "4", "",
                                                "/opt/shop", "on", "off"]))
VALUES = st.recursive(
    st.one_of(SCALARS, st.lists(SCALARS, max_size=2)),
    lambda children: st.dictionaries(st.sampled_from(KEYS), children, max_size=3),
    max_leaves=6,
)
PARAMS = st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=4)

SECRET_NAMES = ["deploy_key", "token", "db", "cert"]
REFERENCES = [
    "vault:secret/data/shop/db#password", "vault:secret/data/shop/public/cdn#key",
    "vault:secret/data/shop/prod/tls#key", "vault:secret/data/blog/db#password",
    "env:SHOP_TOKEN", "env:BLOG_TOKEN", "env:TOKEN", "file:/etc/shop/prod/cert.pem",
    "file:/etc/shop/staging/cert.pem", "file:/run/secrets/token",
]
# Literals and malformed references too: they must never be accepted either.
SECRET_VALUES = st.sampled_from([*REFERENCES, "hunter2", "env:", "vault:no-key"])
PATTERNS = [
    "vault:secret/data/{application}/*", "vault:secret/data/{application}/public/*",
    "vault:secret/data/{application}/{environment}/*", "vault:secret/data/*",
    "env:SHOP_*", "env:*", "file:/etc/{application}/{environment}/*", "file:/run/*", "*",
    "vault:secret/data/blog/*",
]
ROLLOUTS = [{"strategy": "canary", "waves": [10, 100]}, {"strategy": "all"},
            {"strategy": "canary", "waves": [50, 100]}]


@st.composite
def environments(draw) -> dict:
    env = {}
    if draw(st.booleans()):
        env["params"] = draw(PARAMS)
    if draw(st.booleans()):
        env["secrets"] = draw(st.dictionaries(st.sampled_from(SECRET_NAMES),
                                              st.sampled_from(REFERENCES), max_size=3))
    if draw(st.booleans()):
        env["rollout"] = draw(st.sampled_from(ROLLOUTS))
    rollback = draw(st.sampled_from([None, {"enabled": True}, {"enabled": False},
                                     {"enabled": True, "keep": 3}, {"keep": 2}]))
    if rollback is not None:
        env["rollback"] = rollback
    for section in ("agents", "fallback", "listen"):
        if draw(st.booleans()):
            env[section] = draw(VALUES)
    return env


@st.composite
def policies(draw) -> dict:
    rules = {}
    if draw(st.integers(0, 3)):
        rules["params"] = draw(st.lists(st.sampled_from(KEYS), unique=True, max_size=6))
    if draw(st.integers(0, 3)):
        rules["secret_refs"] = draw(st.lists(st.sampled_from(PATTERNS), unique=True,
                                             max_size=4))
    if draw(st.booleans()):
        rules["rollback"] = draw(st.booleans())
    return {"descriptor_policy": rules}


@st.composite
def tenants(draw) -> dict | None:
    tenant = draw(st.sampled_from([None, {}, {"secret_refs": []}]))
    if tenant is None and draw(st.booleans()):
        tenant = {"secret_refs": draw(st.lists(st.sampled_from(PATTERNS), unique=True,
                                               max_size=3))}
    if tenant is not None and draw(st.booleans()):
        # A tenant cannot hand out params or rollback: these keys must change nothing.
        tenant = {**tenant, "params": list(KEYS), "rollback": True}
    return tenant


@st.composite
def descriptors(draw, environment: dict) -> dict:
    desc = {"apiVersion": API_VERSION, "application": APP, "environment": ENV_NAME,
            "id": "rel-1"}
    if draw(st.integers(0, 19)) == 7:
        desc["apiVersion"] = "manent/v1"
    if draw(st.booleans()):
        desc["version"] = draw(st.sampled_from(["1.0", "2.4.0"]))
    if draw(st.booleans()):
        # Often a near-copy of the environment's params, so repeats and conflicts happen.
        params = copy.deepcopy(environment.get("params", {})) if draw(st.booleans()) else {}
        params.update(draw(PARAMS))
        desc["params"] = params
    if draw(st.booleans()):
        secrets = dict(environment.get("secrets", {})) if draw(st.booleans()) else {}
        secrets.update(draw(st.dictionaries(st.sampled_from(SECRET_NAMES), SECRET_VALUES,
                                            max_size=3)))
        desc["secrets"] = secrets
    if "rollout" in environment and draw(st.booleans()):
        # Mostly an identical repeat (allowed), sometimes another strategy.
        desc["rollout"] = draw(st.sampled_from([environment["rollout"]] * 3 + ROLLOUTS))
    elif draw(st.integers(0, 19)) == 7:
        desc["rollout"] = draw(st.sampled_from(ROLLOUTS))
    if draw(st.booleans()):
        desc["rollback"] = {"enabled": draw(st.booleans())}
    for section in ("agents", "fallback", "listen"):
        if draw(st.integers(0, 19)) == 7:
            desc[section] = environment.get(section, draw(VALUES))
    return desc


@st.composite
def layers(draw):
    environment = draw(environments())
    return environment, draw(policies()), draw(tenants()), draw(descriptors(environment))


def run(environment, policy, tenant, desc):
    return merge(environment=copy.deepcopy(environment), policy=copy.deepcopy(policy),
                 tenant=copy.deepcopy(tenant), descriptor=copy.deepcopy(desc),
                 application=APP, environment_name=ENV_NAME)


def leaves(value, path: str = ""):
    if isinstance(value, dict) and (value or not path):
        for key, child in value.items():
            yield from leaves(child, f"{path}.{key}" if path else key)
    else:
        yield path, value


def lookup(config: dict, path: str):
    value = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return "<missing>"
        value = value[part]
    return value


def same(a, b) -> bool:
    """Equal with the same JSON types: 1, 1.0 and True are different values here."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def errors_of(merged) -> set[str]:
    return {json.dumps(e.as_dict(), sort_keys=True) for e in merged.errors}


def shuffled(value, rng: random.Random):
    """The same value with every mapping's insertion order shuffled (lists keep theirs)."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {key: shuffled(child, rng) for key, child in items}
    if isinstance(value, list):
        return [shuffled(child, rng) for child in value]
    return value


# --- (a) the environment is authoritative ---------------------------------------------


@PROPERTY_SETTINGS
@given(layers())
def test_a_value_the_environment_defines_is_kept_or_the_merge_fails(case):
    environment, policy, tenant, desc = case

    merged = run(environment, policy, tenant, desc)

    for path, value in leaves(environment):
        if value == {}:
            continue  # an empty section defines no value; adding to it is allowed
        expected = secret_placeholder(value) if path.startswith("secrets.") else value
        got = lookup(merged.config, path)
        if path == "rollback.enabled" and value is False and got is True:
            # The one change the seed allows: turning rollback on within the policy.
            assert policy["descriptor_policy"].get("rollback") is True
            assert merged.provenance[path] == "descriptor"
            continue
        assert same(got, expected) or merged.errors, (path, value, got)
        if not merged.errors:
            assert merged.provenance[path] == "environment", path


@PROPERTY_SETTINGS
@given(layers())
def test_a_valid_merge_only_adds_and_names_the_layer_of_every_leaf(case):
    environment, policy, tenant, desc = case

    merged = run(environment, policy, tenant, desc)

    if merged.errors:
        return
    env_paths = dict(leaves(environment))
    for path, value in leaves(merged.config):
        if value == {}:
            continue  # an empty section holds no value of its own
        assert merged.provenance.get(path) in ("environment", "descriptor"), path
        if merged.provenance[path] == "descriptor":
            assert path not in env_paths or path == "rollback.enabled", path
    for path, value in leaves(merged.config):
        if path.startswith("secrets."):
            assert value.startswith("${secret:") and value.endswith("}"), (path, value)


# --- (b) deterministic, independent of key order --------------------------------------


@PROPERTY_SETTINGS
@given(layers(), st.randoms(use_true_random=False))
def test_merge_is_deterministic_and_independent_of_key_order(case, rng):
    environment, policy, tenant, desc = case
    rules = policy["descriptor_policy"]
    reordered_policy = {"descriptor_policy": shuffled(
        {key: rng.sample(value, len(value)) if isinstance(value, list) else value
         for key, value in rules.items()}, rng)}
    reordered_tenant = None if tenant is None else shuffled(
        {key: rng.sample(value, len(value)) if key == "secret_refs" else value
         for key, value in tenant.items()}, rng)

    first = run(environment, policy, tenant, desc)
    again = run(environment, policy, tenant, desc)
    reordered = run(shuffled(environment, rng), reordered_policy, reordered_tenant,
                    shuffled(desc, rng))

    for other in (again, reordered):
        assert other.config == first.config
        assert other.provenance == first.provenance
        assert list(other.provenance) == list(first.provenance)
        assert errors_of(other) == errors_of(first)
        assert len(other.errors) == len(first.errors)


# --- (c) the tenant only narrows ------------------------------------------------------


def accepted_secrets(merged) -> set[str]:
    return {path for path, layer in merged.provenance.items()
            if layer == "descriptor" and path.startswith("secrets.")}


def accepted_additions(merged) -> set[str]:
    return {path for path, layer in merged.provenance.items() if layer == "descriptor"}


@PROPERTY_SETTINGS
@given(environments(), policies(), st.lists(st.sampled_from(PATTERNS), unique=True, max_size=4),
       st.dictionaries(st.sampled_from(["s1", "s2", "s3", "s4", "s5"]),
                       st.sampled_from(REFERENCES), min_size=1, max_size=5))
def test_a_tenant_restriction_never_widens_what_the_policy_allows(
    environment, policy, tenant_patterns, secrets
):
    desc = {"apiVersion": API_VERSION, "application": APP, "environment": ENV_NAME,
            "id": "rel-1", "secrets": secrets}

    unrestricted = run(environment, policy, None, desc)
    restricted = run(environment, policy, {"secret_refs": tenant_patterns}, desc)

    assert accepted_secrets(restricted) <= accepted_secrets(unrestricted)
    refused = {(e.path) for e in unrestricted.errors}
    assert refused <= {e.path for e in restricted.errors}
    assert all(e.layer != "tenant" for e in unrestricted.errors)


@PROPERTY_SETTINGS
@given(layers())
def test_no_tenant_accepts_more_than_no_restriction(case):
    environment, policy, tenant, desc = case

    unrestricted = run(environment, policy, None, desc)
    restricted = run(environment, policy, tenant, desc)

    assert accepted_additions(restricted) <= accepted_additions(unrestricted)
    assert {e.path for e in unrestricted.errors} <= {e.path for e in restricted.errors}
