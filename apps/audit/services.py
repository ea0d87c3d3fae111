"""Writing audit events; always called inside the changing service's transaction."""

from django.db import models

from apps.audit.models import Action, AuditEvent


def audit_record(
    *,
    actor,
    action: Action,
    obj: models.Model,
    summary: str = "",
    environment=None,
    tenant=None,
    data: dict | None = None,
) -> AuditEvent:
    action = Action(action)  # refuses an unknown action
    is_user = actor is not None and getattr(actor, "is_authenticated", False)
    return AuditEvent.objects.create(
        actor=actor if is_user else None,
        actor_name=actor.get_username() if is_user else "system",
        action=action,
        object_type=obj._meta.label_lower,
        object_id=str(obj.pk or ""),
        object_repr=str(obj)[:200],
        tenant=tenant,
        environment=environment,
        summary=summary[:500],
        data=data or {},
    )
