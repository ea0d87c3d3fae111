"""State changes of environments and their files; each writes its audit event."""

import json
import re

from django.conf import settings
from django.db import transaction

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks
from apps.core.errors import Conflict, ValidationFailed
from apps.core.events import emit
from apps.core.text import name_problem
from apps.environments.models import (
    SETTING_RANGES,
    Descriptor,
    Environment,
    FallbackFile,
    PlatformPolicy,
    Template,
)
from apps.environments.selectors import environment_limits
from apps.tenancy.models import Application, Membership, Tenant
from configlang.rendering import (
    path_collisions,
    path_problem,
    schema_problems,
    template_syntax_problems,
)
from configlang.secrets import secret_file_mode
from configlang.yamlconfig import load_config, value_problems

EDITABLE_FIELDS = ("config", "config_schema", "poll_interval_s", "release_policy",
                   "drift_policy", "keep_rollout_pins", *SETTING_RANGES)
# What a snapshot is rendered from; the other fields are settings.
RENDERED_FIELDS = ("config", "config_schema")


def check_config(config: str, limits: dict) -> None:
    """Raise ValidationFailed naming the line when `config` is not a YAML mapping,
    or the key when its `secret_file_mode` is refused."""
    value, problems = load_config(config, limits=limits)
    if not problems:
        problems = secret_file_mode(value)[1]
    if problems:
        raise ValidationFailed(
            f"config is not valid: {problems[0]}",
            code="config_invalid",
            details=[p.as_dict() for p in problems],
        )


def config_schema_problems(config: str, schema, limits: dict) -> list:
    """Where the environment's own config breaks its JSON Schema, as a publish
    without a descriptor would find it (a well-formed config and schema assumed:
    check_config and check_config_schema say what is wrong with those)."""
    if not schema:
        return []
    value, problems = load_config(config, limits=limits)
    if problems or not isinstance(value, dict):
        return []
    return [p for p in schema_problems(schema, value) if p.code == "config_schema"]


def check_config_schema(schema) -> None:
    """Raise ValidationFailed when `schema` is not a JSON Schema (None means none)."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ValidationFailed("config_schema must be a JSON object or null.")
    limits = settings.BELLWETHER_LIMITS
    bounds = value_problems(schema, max_depth=limits["max_config_depth"],
                            max_nodes=limits["max_config_nodes"], file="config_schema")
    if bounds:
        raise ValidationFailed(f"config_schema: {bounds[0].message}", code="schema_invalid")
    if "\\u0000" in json.dumps(schema):
        raise ValidationFailed("config_schema must not contain NUL characters.",
                               code="schema_invalid")
    # A trial validation also resolves the schema's $refs (nothing is fetched).
    problems = [p for p in schema_problems(schema, {}) if p.code == "schema_invalid"]
    if problems:
        raise ValidationFailed(f"config_schema: {problems[0].message}", code="schema_invalid",
                               details=[p.as_dict() for p in problems])


def _check_poll_interval(value: int) -> None:
    if not isinstance(value, int) or not 5 <= value <= 3600:
        raise ValidationFailed(
            "poll_interval_s must be between 5 and 3600 seconds.", code="invalid"
        )


def _check_release_policy(value) -> None:
    if value not in Environment.ReleasePolicy.values:
        raise ValidationFailed(
            f"release_policy must be one of {', '.join(Environment.ReleasePolicy.values)}.",
            code="invalid", details=[{"field": "release_policy",
                                      "message": f"{value!r} is not a release policy"}])


def _check_drift_policy(value) -> None:
    if value not in Environment.DriftPolicy.values:
        raise ValidationFailed(
            f"drift_policy must be one of {', '.join(Environment.DriftPolicy.values)}.",
            code="invalid", details=[{"field": "drift_policy",
                                      "message": f"{value!r} is not a drift policy"}])


def environment_create(
    *,
    application: Application,
    name: str,
    config: str = "",
    config_schema: dict | None = None,
    poll_interval_s: int = 30,
    release_policy: str = Environment.ReleasePolicy.DIRECT,
    drift_policy: str = Environment.DriftPolicy.REPORT,
    actor,
) -> Environment:
    _check_release_policy(release_policy)
    _check_drift_policy(drift_policy)
    environment = Environment(
        application=application,
        name=name,
        config=config,
        config_schema=config_schema,
        poll_interval_s=poll_interval_s,
        release_policy=release_policy,
        drift_policy=drift_policy,
    )
    environment.full_clean(exclude=["owners"], validate_unique=False)
    check_config(config, environment_limits(environment))
    check_config_schema(config_schema)
    _check_poll_interval(poll_interval_s)
    with transaction.atomic():
        if Environment.objects.filter(application=application, name=name).exists():
            raise Conflict(f"Environment {application.name}/{name} already exists.")
        environment.save()
        audit_record(
            actor=actor,
            action=Action.ENVIRONMENT_CREATE,
            obj=environment,
            environment=environment,
            tenant=application.tenant,
            summary=f"Created environment {environment.full_name}",
        )
    return environment


def check_changes(environment: Environment, changes: dict) -> None:
    """Refuse changes that are not editable or do not parse (before any lock)."""
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise ValidationFailed(f"Cannot change {', '.join(sorted(unknown))}.")
    if "config" in changes:
        check_config(changes["config"], environment_limits(environment))
    if "config_schema" in changes:
        check_config_schema(changes["config_schema"])
    if "poll_interval_s" in changes:
        _check_poll_interval(changes["poll_interval_s"])
    if "release_policy" in changes:
        _check_release_policy(changes["release_policy"])
    if "drift_policy" in changes:
        _check_drift_policy(changes["drift_policy"])
    for field in set(changes) & set(SETTING_RANGES):
        check_setting_range(field, changes[field])


def check_setting_range(field: str, value) -> None:
    """Retention bounds and the shrink threshold: whole numbers within their range."""
    low, high = SETTING_RANGES[field]
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationFailed(f"{field} must be a whole number from {low} to {high}.",
                               code="invalid", details=[{"field": field,
                                                         "message": f"{value!r} is out of range"}])


def check_version(environment: Environment, expected_version: int | None) -> None:
    """409 stale when `environment` (locked) is no longer at `expected_version`
    (None: the caller did not ask for a compare-and-set)."""
    if expected_version is not None and environment.version != expected_version:
        raise Conflict(
            f"{environment.full_name} changed since you loaded it (version "
            f"{environment.version}, not {expected_version}).", code="stale",
            details=[{"field": "expected_version", "version": environment.version}])


def environment_change(*, environment: Environment, actor, **changes) -> Environment:
    """Change the config, schema or settings of `environment` (locked), `changes`
    checked with check_changes before the lock was taken. A change of what
    snapshots render from and a change of settings are audited apart: only the
    first waits in pending changes."""
    locks.require_transaction()
    changed = [f for f, v in changes.items() if getattr(environment, f) != v]
    if not changed:
        return environment
    for field in changed:
        setattr(environment, field, changes[field])
    environment.version += 1
    environment.save(update_fields=[*changed, "version", "updated_at"])
    inputs = [f for f in changed if f in RENDERED_FIELDS]
    for action, fields in ((Action.ENVIRONMENT_UPDATE, inputs),
                           (Action.ENVIRONMENT_SETTINGS,
                            [f for f in changed if f not in inputs])):
        if fields:
            audit_record(actor=actor, action=action, obj=environment, environment=environment,
                         tenant=environment.application.tenant,
                         summary=f"Changed {', '.join(fields)} of {environment.full_name}",
                         data={"fields": fields})
    emit("pending", environment_id=environment.pk)
    return environment


_FILE_MODELS = {"template": (Template, "source"), "fallback": (FallbackFile, "content")}


def check_file(kind: str, path: str, text: str, limits: dict) -> None:
    """Raise ValidationFailed for an unsafe path, an oversized file or bad template syntax."""
    reason = path_problem(path) or name_problem(path)
    if reason:
        raise ValidationFailed(f"{path!r}: {reason}", code="invalid_path",
                               details=[{"file": path, "message": reason}])
    size = len(text.encode())
    if size > limits["max_file_bytes"]:
        raise ValidationFailed(
            f"{path}: {size} bytes; the limit is {limits['max_file_bytes']}",
            code="file_too_large",
        )
    if kind == "template":
        problems = template_syntax_problems([{"path": path, "source": text}])
        if problems:
            raise ValidationFailed(str(problems[0]), code="template_syntax",
                                   details=[p.as_dict() for p in problems])


def environment_file_put(
    *, environment: Environment, kind: str, path: str, text: str, actor
) -> Template | FallbackFile:
    """Create or replace a template (kind "template") or fallback file ("fallback")."""
    model, text_field = _FILE_MODELS[kind]
    check_file(kind, path, text, environment_limits(environment))
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        others = model.objects.filter(environment=locked).exclude(path=path)
        collisions = path_collisions([path, *others.values_list("path", flat=True)])
        if collisions:
            parent, child = collisions[0]
            message = f"{parent} is a file, so {child} cannot be written"
            raise ValidationFailed(f"{path!r}: {message}", code="invalid_path",
                                   details=[{"file": path, "message": message}])
        entry = model.objects.filter(environment=locked, path=path).first()
        if entry is not None and getattr(entry, text_field) == text:
            return entry
        created = entry is None
        if created:
            entry = model(environment=locked, path=path)
        setattr(entry, text_field, text)
        entry.save()
        audit_record(
            actor=actor,
            action=Action.file_change(kind, "create" if created else "update"),
            obj=entry,
            environment=locked,
            tenant=locked.application.tenant,
            summary=f"{'Added' if created else 'Changed'} {kind} {path} of {locked.full_name}",
            data={"path": path},
        )
        emit("pending", environment_id=locked.pk)
    return entry


def environment_file_delete(*, environment: Environment, kind: str, path: str, actor) -> None:
    model, _ = _FILE_MODELS[kind]
    with transaction.atomic():
        locked = Environment.objects.lock(environment.pk)
        entry = model.objects.filter(environment=locked, path=path).first()
        if entry is None:
            return
        audit_record(
            actor=actor,
            action=Action.file_change(kind, "delete"),
            obj=entry,
            environment=locked,
            tenant=locked.application.tenant,
            summary=f"Removed {kind} {path} of {locked.full_name}",
            data={"path": path},
        )
        entry.delete()
        emit("pending", environment_id=locked.pk)



def environment_set_owners(*, environment: Environment, owners, actor) -> Environment:
    """Replace the environment's owners (users who administer it besides tenant owners):
    members of its tenant only, since outside it every role is an outsider."""
    wanted = {user.pk: user for user in owners}
    with transaction.atomic():
        # The tenant first (lock order): a member removed meanwhile is not made owner.
        locks.lock_one(Tenant.objects, applications__environments=environment.pk)
        locked = Environment.objects.lock(environment.pk)
        members = set(Membership.objects.filter(
            tenant_id=locked.application.tenant_id, user_id__in=wanted,
        ).values_list("user_id", flat=True))
        strangers = sorted(u.get_username() for pk, u in wanted.items() if pk not in members)
        if strangers:
            raise ValidationFailed(
                f"owners: {', '.join(strangers)} must be members of "
                f"{locked.application.tenant.name} first.", details=[{"field": "owners"}])
        current = set(locked.owners.values_list("pk", flat=True))
        if current == set(wanted):
            return locked
        locked.owners.set(wanted.values())
        _audit_owners(locked, sorted(user.get_username() for user in wanted.values()), actor)
    return locked


def _audit_owners(environment: Environment, names: list[str], actor, why: str = "") -> None:
    audit_record(
        actor=actor,
        action=Action.ENVIRONMENT_OWNERS,
        obj=environment,
        environment=environment,
        tenant=environment.application.tenant,
        summary=f"Owners of {environment.full_name}: {', '.join(names) or 'none'}{why}",
        data={"owners": names},
    )


def environment_owners_drop(*, tenant, user, actor) -> list[Environment]:
    """Take `user` off the owners of every environment of `tenant` (they are leaving
    it), each change audited. Runs inside the caller's transaction, which holds the
    tenant's lock."""
    owned = Environment.objects.filter(application__tenant=tenant, owners=user)
    dropped = locks.lock_all(Environment.objects.select_related("application__tenant")
                             .filter(pk__in=owned.values("pk")))
    for environment in dropped:
        environment.owners.remove(user)
        names = sorted(environment.owners.values_list("username", flat=True))
        _audit_owners(environment, names, actor,
                      why=f" ({user.get_username()} left {tenant.name})")
    return dropped


# --- descriptors -------------------------------------------------------------------

DESCRIPTOR_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")


def descriptor_check(descriptor) -> None:
    """The descriptor's shape; the merge rules are checked against the layers."""
    if not isinstance(descriptor, dict):
        raise ValidationFailed("A descriptor must be a mapping.", code="descriptor_invalid")
    limits = settings.BELLWETHER_LIMITS
    bounds = value_problems(descriptor, max_depth=limits["max_config_depth"],
                            max_nodes=limits["max_config_nodes"], file="descriptor")
    if bounds:
        raise ValidationFailed(f"descriptor: {bounds[0]}", code="descriptor_invalid",
                               details=[p.as_dict() for p in bounds])
    problems = []
    if not isinstance(descriptor.get("id"), str) or not DESCRIPTOR_ID.match(descriptor["id"]):
        problems.append({"key": "id", "message": "required: 1-128 letters, digits, '.', '_', "
                                                  "':' or '-' (the idempotency key)"})
    if "version" in descriptor and not isinstance(descriptor["version"], (str, int, float)):
        problems.append({"key": "version", "message": "must be a string"})
    if "notes" in descriptor and not isinstance(descriptor["notes"], str):
        problems.append({"key": "notes", "message": "must be a string"})
    for key in ("application", "environment"):
        if not isinstance(descriptor.get(key), str):
            problems.append({"key": key, "message": "required: a name"})
    if problems:
        raise ValidationFailed(f"descriptor {problems[0]['key']}: {problems[0]['message']}",
                               code="descriptor_invalid", details=problems)


def descriptor_record(*, environment: Environment, descriptor: dict, content_hash: str,
                      publication, actor) -> Descriptor:
    """Remember a submitted descriptor by its id, for idempotency."""
    return Descriptor.objects.create(
        environment=environment, descriptor_id=descriptor["id"], content=descriptor,
        content_hash=content_hash, publication=publication,
        submitted_by=actor if getattr(actor, "is_authenticated", False) else None)


def policy_publish(*, content: dict, actor) -> PlatformPolicy:
    """A new platform policy version (versions are never edited)."""
    if not isinstance(content, dict) or not isinstance(
            content.get("descriptor_policy", {}), dict):
        raise ValidationFailed("A policy is a mapping with a descriptor_policy mapping.")
    with transaction.atomic():
        newest = locks.lock_first(PlatformPolicy.objects.order_by("-version"))
        policy = PlatformPolicy.objects.create(
            version=(newest.version + 1) if newest else 1, content=content,
            created_by=actor if getattr(actor, "is_authenticated", False) else None)
        audit_record(actor=actor, action=Action.POLICY_PUBLISH, obj=policy,
                     summary=f"Platform policy v{policy.version}")
    return policy
