"""Environments: an application's authoritative config, file templates and fallback."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.core import locks
from apps.core.validators import validate_name_text
from apps.tenancy.models import Application, slug_validator


class EnvironmentQuerySet(models.QuerySet):
    def visible_to(self, user) -> "EnvironmentQuerySet":
        """What `user` may see: the one scoping rule every surface reuses. Only
        members of the environment's tenant see it (an environment owner too is a
        member: outside the tenant every role is an outsider)."""
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_superuser:
            return self
        visible = Q(application__tenant__memberships__user=user)
        return self.filter(pk__in=Environment.objects.filter(visible).values("pk"))

    def owned_by(self, user) -> "EnvironmentQuerySet":
        """What `user` administers: as a tenant owner, or as an environment owner
        while a member of its tenant."""
        if not user.is_authenticated or not user.is_active:
            return self.none()
        if user.is_superuser:
            return self
        # One filter() call: both branches name the same membership row.
        owned = Q(application__tenant__memberships__user=user) & (
            Q(owners=user) | Q(application__tenant__memberships__role="owner"))
        return self.filter(pk__in=Environment.objects.filter(owned).values("pk"))

    def lock(self, pk: int) -> "Environment":
        """The environment, locked: the first lock every writer of it takes."""
        return locks.lock_one(self.select_related("application__tenant", "active_snapshot"),
                              pk=pk)


# The settings an owner bounds, with the range each accepts (the database checks
# the same ranges): retention keeps at most this many snapshots, stored bytes and
# finished rollouts; a publish shrinking by this percent needs confirmation (0: off).
SETTING_RANGES = {
    "retention_snapshots": (2, 100_000),
    "retention_bytes": (1 << 20, 1 << 40),
    "retention_rollouts": (1, 100_000),
    "shrink_threshold_percent": (0, 100),
}


def _range_check(field: str) -> models.CheckConstraint:
    low, high = SETTING_RANGES[field]
    return models.CheckConstraint(condition=Q(**{f"{field}__gte": low, f"{field}__lte": high}),
                                  name=f"environment_{field}_range")


class Environment(models.Model):
    class ReleasePolicy(models.TextChoices):
        DIRECT = "direct", "Direct: publishing activates the new snapshot"
        STAGED = "staged", "Staged: a rollout or an explicit activation releases it"

    class DriftPolicy(models.TextChoices):
        REPORT = "report", "Report: agents report hand edits of managed files"
        RESTORE = "restore", "Restore: agents report hand edits and re-apply the snapshot"

    application = models.ForeignKey(
        Application, on_delete=models.PROTECT, related_name="environments"
    )
    name = models.CharField(max_length=64, validators=[slug_validator])
    config = models.TextField(
        blank=True, help_text="Authoritative configuration as YAML (a mapping at the top)."
    )
    config_schema = models.JSONField(
        null=True, blank=True, help_text="Optional JSON Schema the config must satisfy."
    )
    poll_interval_s = models.PositiveIntegerField(
        default=30, help_text="How often agents poll for their desired snapshot, in seconds."
    )
    active_snapshot = models.ForeignKey(
        "snapshots.Snapshot", null=True, blank=True, on_delete=models.PROTECT,
        related_name="+", help_text="What auto_pull agents follow.",
    )
    release_policy = models.CharField(
        max_length=16, choices=ReleasePolicy.choices, default=ReleasePolicy.DIRECT,
        help_text="direct: publishing activates the new snapshot; staged: publishing stores "
                  "it, and a rollout or an explicit activation releases it.",
    )
    drift_policy = models.CharField(
        max_length=16, choices=DriftPolicy.choices, default=DriftPolicy.REPORT,
        help_text="What agents do when a managed file no longer matches the applied snapshot "
                  "(a hand edit): report it, or report it and restore the snapshot's files.",
    )
    keep_rollout_pins = models.BooleanField(
        default=False,
        help_text="A finished rollout keeps its remaining pins until they are released "
                  "explicitly (by default they are released when it ends).",
    )
    retention_snapshots = models.PositiveIntegerField(
        default=100, help_text="Snapshots kept at most; beat removes the oldest unreferenced "
                               "ones beyond it (2 to 100,000).")
    retention_bytes = models.PositiveBigIntegerField(
        default=1 << 30, help_text="Stored bytes of its snapshots kept at most (1 MiB to 1 TiB).")
    retention_rollouts = models.PositiveIntegerField(
        default=100, help_text="Finished rollouts kept at most (1 to 100,000).")
    shrink_threshold_percent = models.PositiveSmallIntegerField(
        default=50, help_text="A publish whose files shrink by this percent or more against the "
                              "active snapshot needs an explicit confirmation (0: no check; an "
                              "emptied file always needs one).")
    owners = models.ManyToManyField(
        settings.AUTH_USER_MODEL, blank=True, related_name="owned_environments"
    )
    # Compare-and-set token for changes of the environment's own fields (config,
    # schema, settings): bumped on every such change.
    version = models.PositiveIntegerField(default=1, editable=False)
    # The last snapshot number handed out; bumped under this row's lock so
    # numbers are strictly increasing and never reused.
    snapshot_counter = models.PositiveIntegerField(default=0, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = EnvironmentQuerySet.as_manager()

    class Meta:
        ordering = ["application__name", "name"]
        constraints = [
            models.UniqueConstraint(
                fields=["application", "name"], name="environment_unique_name"
            ),
            models.CheckConstraint(
                condition=Q(poll_interval_s__gte=5) & Q(poll_interval_s__lte=3600),
                name="environment_poll_interval_range",
            ),
            models.CheckConstraint(condition=Q(release_policy__in=["direct", "staged"]),
                                   name="environment_release_policy_valid"),
            models.CheckConstraint(condition=Q(drift_policy__in=["report", "restore"]),
                                   name="environment_drift_policy_valid"),
            *[_range_check(field) for field in SETTING_RANGES],
        ]

    def __str__(self) -> str:
        return self.full_name

    @property
    def full_name(self) -> str:
        return f"{self.application.name}/{self.name}"

    @property
    def is_staged(self) -> bool:
        return self.release_policy == self.ReleasePolicy.STAGED


class PlatformPolicy(models.Model):
    """What descriptors may add, platform-wide. Never edited: each change is a new
    version, and a snapshot records the version it used."""

    version = models.PositiveIntegerField(unique=True)
    content = models.JSONField(default=dict, help_text=(
        '{"descriptor_policy": {"params": [keys], "secret_refs": [patterns], '
        '"rollback": true|false}}'))
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-version"]
        verbose_name_plural = "platform policies"

    def __str__(self) -> str:
        return f"policy v{self.version}"


class Descriptor(models.Model):
    """An app team's release request, kept for idempotency: the same id with the
    same content returns the same publication; with other content it is refused."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="descriptors")
    descriptor_id = models.CharField(max_length=128)
    content = models.JSONField()
    content_hash = models.CharField(max_length=64)
    publication = models.ForeignKey("snapshots.Publication", on_delete=models.CASCADE,
                                    related_name="+")
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "descriptor_id"],
                                    name="descriptor_unique_id"),
        ]

    def __str__(self) -> str:
        return f"{self.descriptor_id} for {self.environment_id}"


class EnvironmentFile(models.Model):
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    path = models.CharField(
        max_length=255, help_text="Relative path on the agent's host, e.g. nginx/site.conf.",
        validators=[validate_name_text],
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
        ordering = ["path"]

    def __str__(self) -> str:
        return self.path


class Template(EnvironmentFile):
    """A Jinja2 template rendered with the environment's config into one file."""

    environment = models.ForeignKey(
        Environment, on_delete=models.CASCADE, related_name="templates"
    )
    source = models.TextField(blank=True)

    class Meta(EnvironmentFile.Meta):
        constraints = [
            models.UniqueConstraint(fields=["environment", "path"], name="template_unique_path")
        ]


class FallbackFile(EnvironmentFile):
    """A literal file the agent writes when nothing else can be restored."""

    environment = models.ForeignKey(
        Environment, on_delete=models.CASCADE, related_name="fallback_files"
    )
    content = models.TextField(blank=True)

    class Meta(EnvironmentFile.Meta):
        constraints = [
            models.UniqueConstraint(fields=["environment", "path"], name="fallback_unique_path")
        ]
