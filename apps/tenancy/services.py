"""State changes of tenants, memberships, applications and API tokens."""

from datetime import datetime

from django.db import transaction
from django.utils import timezone

from apps.audit.models import Action
from apps.audit.services import audit_record
from apps.core import locks, tokens
from apps.core.errors import Conflict, ValidationFailed
from apps.core.text import name_problem
from apps.tenancy.authentication import USER_TOKEN_PREFIX
from apps.tenancy.models import ApiToken, Application, Membership, Role, Tenant


def tenant_create(*, name: str, slug: str, actor) -> Tenant:
    tenant = Tenant(name=name, slug=slug)
    tenant.full_clean(validate_unique=False)
    with transaction.atomic():
        if Tenant.objects.filter(slug=slug).exists() or Tenant.objects.filter(name=name).exists():
            raise Conflict(f"Tenant {slug} already exists.")
        tenant.save()
        audit_record(actor=actor, action=Action.TENANT_CREATE, obj=tenant, tenant=tenant,
                     summary=f"Created tenant {name}")
    return tenant


def check_restrictions(restrictions) -> dict:
    """A tenant only narrows: {"secret_refs": [patterns]} (absent: no narrowing)."""
    if not isinstance(restrictions, dict) or set(restrictions) - {"secret_refs"}:
        raise ValidationFailed('restrictions must be {"secret_refs": [patterns]}.')
    refs = restrictions.get("secret_refs")
    if refs is not None and not (isinstance(refs, list)
                                 and all(isinstance(p, str) and p for p in refs)):
        raise ValidationFailed("restrictions.secret_refs must be a list of patterns.")
    return restrictions


def tenant_update(*, tenant: Tenant, actor, name: str | None = None,
                  restrictions: dict | None = None) -> Tenant:
    """Rename a tenant or change its restrictions (which only narrow the policy)."""
    changes = {k: v for k, v in (("name", name), ("restrictions", restrictions))
               if v is not None}
    if "restrictions" in changes:
        check_restrictions(changes["restrictions"])
    with transaction.atomic():
        locked = locks.lock_one(Tenant.objects, pk=tenant.pk)
        changed = [f for f, v in changes.items() if getattr(locked, f) != v]
        if not changed:
            return locked
        for field in changed:
            setattr(locked, field, changes[field])
        locked.full_clean(validate_unique=False)
        locked.save(update_fields=changed)
        audit_record(actor=actor, action=Action.TENANT_UPDATE, obj=locked, tenant=locked,
                     summary=f"Changed {', '.join(changed)} of tenant {locked.name}",
                     data={"fields": changed})
    return locked


def membership_set(*, tenant: Tenant, user, role: str, actor) -> Membership:
    """Give `user` `role` in `tenant`, creating or changing the membership."""
    if role not in Role.values:
        raise ValidationFailed(f"role must be one of {', '.join(Role.values)}.")
    with transaction.atomic():
        locks.lock_one(Tenant.objects, pk=tenant.pk)  # memberships change under the tenant's
        membership, created = Membership.objects.get_or_create(
            tenant=tenant, user=user, defaults={"role": role}
        )
        if not created and membership.role == role:
            return membership
        if not created:
            membership.role = role
            membership.save(update_fields=["role"])
        audit_record(actor=actor, action=Action.MEMBERSHIP_SET, obj=membership, tenant=tenant,
                     summary=f"{user.get_username()} is now {role} of {tenant.name}",
                     data={"user": user.get_username(), "role": role})
    return membership


def membership_remove(*, membership: Membership, actor) -> None:
    with transaction.atomic():
        audit_record(actor=actor, action=Action.MEMBERSHIP_REMOVE, obj=membership,
                     tenant=membership.tenant,
                     summary=f"Removed {membership.user.get_username()} from "
                             f"{membership.tenant.name}")
        membership.delete()


def application_create(*, tenant: Tenant, name: str, description: str = "", actor) -> Application:
    application = Application(tenant=tenant, name=name, description=description)
    application.full_clean(validate_unique=False)
    with transaction.atomic():
        if Application.objects.filter(name=name).exists():
            raise Conflict(f"Application {name} already exists.")
        application.save()
        audit_record(actor=actor, action=Action.APPLICATION_CREATE, obj=application, tenant=tenant,
                     summary=f"Created application {name} for {tenant.name}")
    return application


def application_update(*, application: Application, description: str, actor) -> Application:
    with transaction.atomic():
        locked = locks.lock_one(Application.objects, pk=application.pk)
        if locked.description == description:
            return locked
        locked.description = description
        locked.save(update_fields=["description"])
        audit_record(actor=actor, action=Action.APPLICATION_UPDATE, obj=locked,
                     tenant=locked.tenant, summary=f"Changed application {locked.name}")
    return locked


def api_token_create(
    *, user, name: str = "", expires_at: datetime | None = None, actor
) -> tuple[ApiToken, str]:
    """Create a token; the plaintext is returned here once and never stored."""
    if name_problem(name):
        raise ValidationFailed(f"name: {name_problem(name)}",
                               details=[{"field": "name", "message": name_problem(name)}])
    if expires_at is not None and expires_at <= timezone.now():
        raise ValidationFailed("expires_at must be in the future.")
    issued = tokens.issue(USER_TOKEN_PREFIX)
    with transaction.atomic():
        token = ApiToken.objects.create(
            user=user, name=name, key=issued.key, secret_hash=issued.secret_hash,
            expires_at=expires_at,
        )
        audit_record(actor=actor, action=Action.API_TOKEN_CREATE, obj=token,
                     summary=f"Created API token {token.key} for {user.get_username()}")
    return token, issued.plaintext


def api_token_revoke(*, token: ApiToken, actor) -> ApiToken:
    with transaction.atomic():
        locked = locks.lock_one(ApiToken.objects, pk=token.pk)
        if locked.revoked_at is not None:
            return locked
        locked.revoked_at = timezone.now()
        locked.save(update_fields=["revoked_at"])
        audit_record(actor=actor, action=Action.API_TOKEN_REVOKE, obj=locked,
                     summary=f"Revoked API token {locked.key} of {locked.user.get_username()}")
    return locked
