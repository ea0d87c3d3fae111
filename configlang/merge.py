"""Merging the configuration layers into an effective config (docs/layers.md). Pure: no
database, no I/O; the same inputs always give the same result.

Layers: platform policy (what a descriptor may add), the environment's config
(authoritative), the tenant's restrictions (only ever narrow what the policy
allows), and an app team's descriptor. Rules:

- The environment is authoritative: a descriptor may add what is missing or
  repeat an identical value; a different value is an error, never an override.
- `agents`, `fallback` and `secret_file_mode` belong to the environment alone; `rollout` may only be
  repeated identically.
- `descriptor_policy.params` lists the params keys a descriptor may add;
  `descriptor_policy.secret_refs` the reference patterns ({application} and
  {environment} are filled in) its secrets may use; the tenant's `secret_refs`
  narrow those further.
- A descriptor may turn rollback on when the policy allows it, never off when
  the environment imposes it.
- Secrets are references only (env:NAME, file:/path, vault:path#key); templates
  see a placeholder `${secret:<reference>}` that the agent resolves on its host.

All errors are collected; each names its layer, key path and the values involved.
"""

from __future__ import annotations

import copy
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from configlang.secrets import reference_refusal
from configlang.values import copied

API_VERSION = "bellwether/v1"
DESCRIPTOR_FIELDS = ("apiVersion", "application", "environment", "id", "version", "params",
                     "secrets", "rollout", "rollback", "notes")
ENVIRONMENT_ONLY = ("agents", "fallback", "secret_file_mode")
SECRET_REFERENCE = re.compile(
    r"^(env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\s}]+|vault:[^\s#}]+#[^\s#}]+)$"
)
_ABSENT = object()


@dataclass(frozen=True)
class MergeError:
    layer: str  # the layer whose rule refuses: descriptor, environment, policy or tenant
    path: str
    message: str
    environment_value: Any = _ABSENT
    descriptor_value: Any = _ABSENT

    def as_dict(self) -> dict:
        out = {"code": "merge_conflict" if self.environment_value is not _ABSENT
               and self.descriptor_value is not _ABSENT else "merge_refused",
               "layer": self.layer, "key": self.path, "message": self.message}
        if self.environment_value is not _ABSENT:
            out["environment_value"] = self.environment_value
        if self.descriptor_value is not _ABSENT:
            out["descriptor_value"] = self.descriptor_value
        return out

    def __str__(self) -> str:
        return f"{self.layer}: {self.path}: {self.message}"


@dataclass
class Merged:
    config: dict
    provenance: dict = field(default_factory=dict)  # key path -> layer that set it
    errors: list = field(default_factory=list)

    @property
    def is_valid(self) -> bool:
        return not self.errors


def secret_placeholder(reference: str) -> str:
    return "${secret:" + reference + "}"


def _leaves(value, path: str):
    """(path, value) of every leaf: scalars, lists and empty mappings below the root."""
    if isinstance(value, dict) and (value or not path):
        for key, child in value.items():
            yield from _leaves(child, f"{path}.{key}" if path else str(key))
    else:
        yield path, value


def _mark(provenance: dict, value, path: str, layer: str) -> None:
    for leaf, _ in _leaves(value, path):
        provenance[leaf] = layer


def _pattern(pattern: str, application: str, environment: str) -> str:
    return pattern.replace("{application}", application).replace("{environment}", environment)


class _Merge:
    def __init__(self, *, environment: dict, policy: dict, tenant: dict, descriptor: dict | None,
                 application: str, environment_name: str):
        self.env = environment
        self.policy = (policy or {}).get("descriptor_policy") or {}
        self.tenant = tenant or {}
        self.descriptor = descriptor
        self.application, self.environment_name = application, environment_name
        self.config = copied(environment)
        self.provenance: dict = {}
        self.errors: list[MergeError] = []

    def error(self, layer: str, path: str, message: str, **values) -> None:
        self.errors.append(MergeError(layer, path, message, **values))

    def run(self) -> Merged:
        _mark(self.provenance, self.env, "", "environment")
        env_secrets = self.env.get("secrets", {})
        if not isinstance(env_secrets, dict):
            self.error("environment", "secrets", "must be a mapping of name to reference")
            env_secrets = {}
        for name, reference in env_secrets.items():
            self._check_reference("environment", f"secrets.{name}", reference)
        if self.descriptor is not None:
            if "descriptor" in self.env:
                self.error("environment", "descriptor", "is reserved for the descriptor's id, "
                           "version and notes", environment_value=self.env["descriptor"])
            self._descriptor()
        secrets = self.config.get("secrets")
        if isinstance(secrets, dict):
            self.config["secrets"] = {
                name: secret_placeholder(ref) if isinstance(ref, str) else ref
                for name, ref in secrets.items()
            }
        return Merged(self.config, dict(sorted(self.provenance.items())), self.errors)

    def _check_reference(self, layer: str, path: str, reference) -> bool:
        if isinstance(reference, str) and SECRET_REFERENCE.match(reference):
            refusal = reference_refusal(reference)
            if refusal is None:
                return True
            self.error(layer, path, refusal)
            return False
        self.error(layer, path, "holds a literal value; a secret must be a reference "
                                "(env:NAME, file:/path or vault:path#key)")
        return False

    # --- the descriptor ------------------------------------------------------------

    def _descriptor(self) -> None:
        d = self.descriptor
        for key in d:
            if key in ENVIRONMENT_ONLY:
                self.error("descriptor", key, "belongs to the environment; a descriptor may "
                                              "not set it", descriptor_value=d[key])
            elif key not in DESCRIPTOR_FIELDS:
                self.error("descriptor", key, "is not a descriptor field")
        if d.get("apiVersion") != API_VERSION:
            self.error("descriptor", "apiVersion", f"must be {API_VERSION}",
                       descriptor_value=d.get("apiVersion"))
        for key, expected in (("application", self.application),
                              ("environment", self.environment_name)):
            if d.get(key) != expected:
                self.error("descriptor", key, f"names {d.get(key)!r}, not {expected!r}",
                           descriptor_value=d.get(key))
        if "rollout" in d and d["rollout"] != self.env.get("rollout", _ABSENT):
            self.error("descriptor", "rollout", "belongs to the environment; a descriptor may "
                                                "only repeat it identically",
                       environment_value=self.env.get("rollout"), descriptor_value=d["rollout"])
        if "rollback" in d:
            self._rollback(d["rollback"])
        if "params" in d:
            self._params(d["params"])
        if "secrets" in d:
            self._secrets(d["secrets"])
        release = {k: d[k] for k in ("id", "version", "notes") if k in d}
        self.config["descriptor"] = release
        _mark(self.provenance, release, "descriptor", "descriptor")

    def _rollback(self, wanted) -> None:
        if not isinstance(wanted, dict) or not isinstance(wanted.get("enabled"), bool) or (
                set(wanted) - {"enabled"}):
            self.error("descriptor", "rollback", "must be {enabled: true|false}",
                       descriptor_value=wanted)
            return
        env_rollback = self.env.get("rollback") or {}
        imposed = isinstance(env_rollback, dict) and env_rollback.get("enabled") is True
        if wanted["enabled"] is False:
            if imposed:
                self.error("descriptor", "rollback.enabled", "the environment imposes "
                           "rollback; a descriptor cannot turn it off",
                           environment_value=True, descriptor_value=False)
            return
        if imposed:
            return  # an identical repeat
        if self.policy.get("rollback") is not True:
            self.error("policy", "rollback.enabled", "descriptor_policy.rollback does not let "
                       "a descriptor turn rollback on", descriptor_value=True)
            return
        self.config["rollback"] = {**(env_rollback if isinstance(env_rollback, dict) else {}),
                                   "enabled": True}
        self.provenance["rollback.enabled"] = "descriptor"

    def _params(self, params) -> None:
        if not isinstance(params, dict):
            self.error("descriptor", "params", "must be a mapping", descriptor_value=params)
            return
        if not params:
            return
        target = self.config.setdefault("params", {})
        if not isinstance(target, dict):
            self.error("environment", "params", "must be a mapping to take descriptor params",
                       environment_value=target)
            return
        allowed = set(self.policy.get("params") or [])
        for key, value in params.items():
            self._merge_value(target, key, value, f"params.{key}", allowed=key in allowed)

    def _merge_value(self, target: dict, key: str, value, path: str, *, allowed: bool) -> None:
        if key not in target:
            if not allowed:
                self.error("policy", path, "descriptor_policy.params does not allow a "
                                           "descriptor to add this key", descriptor_value=value)
                return
            target[key] = copy.deepcopy(value)
            _mark(self.provenance, value, path, "descriptor")
            return
        current = target[key]
        if isinstance(current, dict) and isinstance(value, dict):
            for child_key, child in value.items():
                self._merge_value(current, child_key, child, f"{path}.{child_key}",
                                  allowed=allowed)
        elif current != value or type(current) is not type(value):
            self.error("descriptor", path, "the environment defines a different value; a "
                       "descriptor may only add or repeat",
                       environment_value=current, descriptor_value=value)

    def _secrets(self, secrets) -> None:
        if not isinstance(secrets, dict):
            self.error("descriptor", "secrets", "must be a mapping of name to reference",
                       descriptor_value=secrets)
            return
        if not secrets:
            return
        target = self.config.setdefault("secrets", {})
        if not isinstance(target, dict):
            return  # the environment's secrets are not a mapping: already an error
        patterns = [_pattern(p, self.application, self.environment_name)
                    for p in self.policy.get("secret_refs") or []]
        narrowed = self.tenant.get("secret_refs")
        tenant_patterns = None if narrowed is None else [
            _pattern(p, self.application, self.environment_name) for p in narrowed]
        for name, reference in secrets.items():
            path = f"secrets.{name}"
            if not self._check_reference("descriptor", path, reference):
                continue
            if name in target:
                if target[name] != reference:
                    self.error("descriptor", path, "the environment declares this secret with "
                               "another reference", environment_value=target[name],
                               descriptor_value=reference)
                continue
            if not any(fnmatch.fnmatchcase(reference, p) for p in patterns):
                self.error("policy", path, "descriptor_policy.secret_refs does not allow this "
                                           "reference", descriptor_value=reference)
                continue
            if tenant_patterns is not None and not any(
                    fnmatch.fnmatchcase(reference, p) for p in tenant_patterns):
                self.error("tenant", path, "the tenant restricts secret references and this "
                                           "one is not among them", descriptor_value=reference)
                continue
            target[name] = reference
            self.provenance[path] = "descriptor"


def merge(*, environment: dict, policy: dict | None, tenant: dict | None,
          descriptor: dict | None, application: str, environment_name: str) -> Merged:
    """The effective config, its provenance, and every error found."""
    return _Merge(environment=environment, policy=policy or {}, tenant=tenant or {},
                  descriptor=descriptor, application=application,
                  environment_name=environment_name).run()
