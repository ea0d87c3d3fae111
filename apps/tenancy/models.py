"""Tenants, their members and roles, the applications they own, and user API tokens."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models
from django.db.models import Q

from apps.core.validators import validate_name_text

slug_validator = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,62}[a-z0-9])?$",
    "Use lowercase letters, digits and hyphens (1-64 characters, no leading or "
    "trailing hyphen).",
)


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    DEPLOYER = "deployer", "Deployer"
    OWNER = "owner", "Owner"


ROLE_RANK = {Role.VIEWER: 1, Role.DEPLOYER: 2, Role.OWNER: 3}


class Tenant(models.Model):
    name = models.CharField(max_length=200, unique=True, validators=[validate_name_text])
    slug = models.SlugField(max_length=64, unique=True, validators=[slug_validator])
    restrictions = models.JSONField(
        default=dict, blank=True,
        help_text='Only narrows what the platform policy allows, e.g. {"secret_refs": '
                  '["vault:secret/data/{application}/*"]}.',
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["tenant", "user"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "user"], name="membership_unique_user"),
            models.CheckConstraint(
                condition=Q(role__in=[r.value for r in Role]), name="membership_role_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user} is {self.role} of {self.tenant}"


class Application(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="applications")
    name = models.CharField(max_length=64, unique=True, validators=[slug_validator])
    description = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ApiToken(models.Model):
    """A user's token for CI and scripts. Only a hash of the secret is stored."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True, validators=[validate_name_text])
    key = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API token"

    def __str__(self) -> str:
        return f"{self.key} ({self.user})"
