"""State changes of environments and their files; each writes its audit event."""

import json

from django.db import transaction

from apps.audit.services import audit_record
from apps.core.errors import Conflict, ValidationFailed
from apps.environments.models import Environment, FallbackFile, Template
from apps.environments.selectors import environment_limits
from apps.fleet.services import environment_polls_changed
from apps.snapshots.rendering import (
    path_collisions,
    path_problem,
    schema_problems,
    template_syntax_problems,
)
from apps.snapshots.yamlconfig import load_config
from apps.tenancy.models import Application

EDITABLE_FIELDS = ("config", "config_schema", "poll_interval_s", "require_activation")


def check_config(config: str, limits: dict) -> None:
    """Raise ValidationFailed naming the line when `config` is not a YAML mapping."""
    _, problems = load_config(config, limits=limits)
    if problems:
        raise ValidationFailed(
            f"config is not valid: {problems[0]}",
            code="config_invalid",
            details=[p.as_dict() for p in problems],
        )


def check_config_schema(schema) -> None:
    """Raise ValidationFailed when `schema` is not a JSON Schema (None means none)."""
    if schema is None:
        return
    if not isinstance(schema, dict):
        raise ValidationFailed("config_schema must be a JSON object or null.")
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


def environment_create(
    *,
    application: Application,
    name: str,
    config: str = "",
    config_schema: dict | None = None,
    poll_interval_s: int = 30,
    actor,
) -> Environment:
    environment = Environment(
        application=application,
        name=name,
        config=config,
        config_schema=config_schema,
        poll_interval_s=poll_interval_s,
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
            action="environment.create",
            obj=environment,
            environment=environment,
            tenant=application.tenant,
            summary=f"Created environment {environment.full_name}",
        )
    return environment


def environment_update(*, environment: Environment, actor, **changes) -> Environment:
    """Change the config, schema or poll interval. Refuses YAML that does not parse."""
    unknown = set(changes) - set(EDITABLE_FIELDS)
    if unknown:
        raise ValidationFailed(f"Cannot change {', '.join(sorted(unknown))}.")
    if "config" in changes:
        check_config(changes["config"], environment_limits(environment))
    if "config_schema" in changes:
        check_config_schema(changes["config_schema"])
    if "poll_interval_s" in changes:
        _check_poll_interval(changes["poll_interval_s"])
    with transaction.atomic():
        locked = Environment.objects.select_for_update().get(pk=environment.pk)
        changed = [f for f, v in changes.items() if getattr(locked, f) != v]
        if not changed:
            return locked
        for field in changed:
            setattr(locked, field, changes[field])
        locked.save(update_fields=[*changed, "updated_at"])
        if "poll_interval_s" in changed:
            environment_polls_changed(locked)
        audit_record(
            actor=actor,
            action="environment.update",
            obj=locked,
            environment=locked,
            tenant=locked.application.tenant,
            summary=f"Changed {', '.join(changed)} of {locked.full_name}",
            data={"fields": changed},
        )
    return locked


_FILE_MODELS = {"template": (Template, "source"), "fallback": (FallbackFile, "content")}


def check_file(kind: str, path: str, text: str, limits: dict) -> None:
    """Raise ValidationFailed for an unsafe path, an oversized file or bad template syntax."""
    reason = path_problem(path)
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
        locked = Environment.objects.select_for_update().get(pk=environment.pk)
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
            action=f"{kind}.{'create' if created else 'update'}",
            obj=entry,
            environment=locked,
            tenant=locked.application.tenant,
            summary=f"{'Added' if created else 'Changed'} {kind} {path} of {locked.full_name}",
            data={"path": path},
        )
    return entry


def environment_file_delete(*, environment: Environment, kind: str, path: str, actor) -> None:
    model, _ = _FILE_MODELS[kind]
    with transaction.atomic():
        locked = Environment.objects.select_for_update().get(pk=environment.pk)
        entry = model.objects.filter(environment=locked, path=path).first()
        if entry is None:
            return
        audit_record(
            actor=actor,
            action=f"{kind}.delete",
            obj=entry,
            environment=locked,
            tenant=locked.application.tenant,
            summary=f"Removed {kind} {path} of {locked.full_name}",
            data={"path": path},
        )
        entry.delete()



def environment_set_owners(*, environment: Environment, owners, actor) -> Environment:
    """Replace the environment's owners (users who administer it besides tenant owners)."""
    wanted = {user.pk: user for user in owners}
    with transaction.atomic():
        locked = Environment.objects.select_for_update().get(pk=environment.pk)
        current = set(locked.owners.values_list("pk", flat=True))
        if current == set(wanted):
            return locked
        locked.owners.set(wanted.values())
        names = sorted(user.get_username() for user in wanted.values())
        audit_record(
            actor=actor,
            action="environment.owners",
            obj=locked,
            environment=locked,
            tenant=locked.application.tenant,
            summary=f"Owners of {locked.full_name}: {', '.join(names) or 'none'}",
            data={"owners": names},
        )
    return locked
