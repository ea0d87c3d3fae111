"""Reads about environments: lookup scoped to the user, and the user's role there."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import QuerySet

from apps.core.errors import NotFound, PermissionDenied
from apps.environments.models import Environment, PlatformPolicy
from apps.tenancy.models import ROLE_RANK, Membership, Role


def environment_role(*, user, environment: Environment) -> Role | None:
    """The strongest role `user` holds for `environment`, or None."""
    if not user.is_authenticated or not user.is_active:
        return None
    if user.is_superuser:
        return Role.OWNER
    role = (
        Membership.objects.filter(tenant_id=environment.application.tenant_id, user=user)
        .values_list("role", flat=True)
        .first()
    )
    if role is None:  # outside the tenant, an environment ownership counts for nothing
        return None
    if environment.owners.filter(pk=user.pk).exists():
        return Role.OWNER
    return Role(role)


def environment_get(
    *, user, application: str, name: str, required: Role = Role.VIEWER
) -> Environment:
    """The environment `application/name` if `user` may see it (404 otherwise) and
    holds at least `required` there (403 otherwise)."""
    environment = (
        Environment.objects.visible_to(user)
        .select_related("application__tenant")
        .filter(application__name=application, name=name)
        .first()
    )
    if environment is None:
        raise NotFound(f"Environment {application}/{name} not found.")
    require_role(user=user, environment=environment, required=required)
    return environment


def has_role(*, user, environment: Environment, required: Role) -> bool:
    """Whether `user` holds at least `required` on `environment`."""
    role = environment_role(user=user, environment=environment)
    return role is not None and ROLE_RANK[role] >= ROLE_RANK[required]


def require_role(*, user, environment: Environment, required: Role) -> None:
    """403 unless `user` holds at least `required` on an environment they can see."""
    if not has_role(user=user, environment=environment, required=required):
        raise PermissionDenied(
            f"This needs the {required.label.lower()} role on {environment.full_name}."
        )


def owner_candidates(*, user, environment: Environment | None) -> QuerySet:
    """The users `user` may name as owners of `environment`: its tenant's members,
    never a user of another tenant (an owner form must not list the installation's
    users; an owner who is no member would count for nothing)."""
    users = get_user_model().objects.filter(is_active=True).order_by("username")
    if environment is None or environment.pk is None:
        return users.none()
    return users.filter(memberships__tenant_id=environment.application.tenant_id).distinct()


def current_policy() -> dict:
    """The newest platform policy version, as frozen into a snapshot's source."""
    policy = PlatformPolicy.objects.order_by("-version").first()
    return {"version": policy.version, "content": policy.content} if policy else {
        "version": 0, "content": {}}


def environment_limits(environment: Environment) -> dict:
    """The limits a snapshot of `environment` is held to (frozen into its source)."""
    return dict(settings.BELLWETHER_LIMITS)
