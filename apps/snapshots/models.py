"""Snapshots (immutable, numbered, checksummed) and the publications that make them."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import BigIntegerField, F, Func, Q, TextField
from django.db.models.functions import Cast

from apps.environments.models import Environment


class _StoredBytes(Func):
    """The bytes a column holds: octet_length on PostgreSQL, a BLOB's length on SQLite."""

    output_field = BigIntegerField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="octet_length(%(expressions)s)")

    def as_sqlite(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="length(CAST(%(expressions)s AS BLOB))")


BINARY_COLUMNS = ("bundle", "bundle_gzip")
JSON_COLUMNS = ("source", "effective_config", "provenance", "files", "fallback_files", "report")
# A snapshot's stored content: large, and a joined snapshot repeats on every row
# (a thousand agents joined to one active snapshot carry its bundle a thousand
# times). Reads that need a snapshot's identity (number, label, checksum, state)
# defer them: without_content.
CONTENT_COLUMNS = BINARY_COLUMNS + JSON_COLUMNS


def without_content(queryset, *relations: str):
    """`queryset` without the content columns of the snapshots it joins through
    `relations` (of its own rows when none is named)."""
    return queryset.defer(*(f"{relation}__{column}" if relation else column
                            for relation in relations or ("",) for column in CONTENT_COLUMNS))


def stored_bytes():
    """An expression: the bytes one snapshot stores (its bundles and JSON columns)."""
    parts = [_StoredBytes(c) for c in BINARY_COLUMNS]
    parts += [_StoredBytes(Cast(c, TextField())) for c in JSON_COLUMNS]
    total = parts[0]
    for part in parts[1:]:
        total = total + part
    return total


class SnapshotQuerySet(models.QuerySet):
    def with_stored_bytes(self) -> "SnapshotQuerySet":
        return self.annotate(stored_bytes=stored_bytes())

    def quarantined(self) -> "SnapshotQuerySet":
        """Snapshots whose content is quarantined in their environment: by checksum,
        whatever their number. The quarantines (apps.rollouts' SnapshotQuarantine)
        are reached through the relation they declare on the environment."""
        return self.filter(environment__quarantines__checksum=F("checksum"))

    def unquarantined(self) -> "SnapshotQuerySet":
        """The others: what may be released without an owner's override."""
        return self.exclude(pk__in=self.model.objects.quarantined().values("pk"))


class Snapshot(models.Model):
    """A complete rendered release of one environment. Never updated once stored:
    a database trigger refuses any change to its content columns."""

    class State(models.TextChoices):
        READY = "ready", "Ready"
        INVALID = "invalid", "Invalid"

    environment = models.ForeignKey(
        Environment, on_delete=models.PROTECT, related_name="snapshots"
    )
    number = models.PositiveIntegerField()
    label = models.CharField(max_length=16, help_text="YYYYMMDD-NNN")
    state = models.CharField(max_length=16, choices=State.choices)
    source = models.JSONField(help_text="Every input, enough to re-render this snapshot.")
    effective_config = models.JSONField(default=dict)
    # Key path -> the layer that set it (environment, descriptor).
    provenance = models.JSONField(default=dict)
    files = models.JSONField(default=list)
    fallback_files = models.JSONField(default=list)
    checksum = models.CharField(max_length=71)
    # What agents download: serialised once, served as stored, ETag = checksum;
    # and the same bytes gzip-compressed once, for clients that accept gzip.
    bundle = models.BinaryField(default=b"", editable=False)
    bundle_gzip = models.BinaryField(default=b"", editable=False)
    report = models.JSONField(default=dict)
    # The environment's newest audit event when the inputs were captured: the
    # changes after it are what this snapshot does not contain (pending changes).
    inputs_audit_id = models.BigIntegerField(null=True, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    # Lineage: emptied (the one change the immutability trigger allows besides the
    # author) only when retention removes the snapshot it names.
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    rolled_back_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SnapshotQuerySet.as_manager()

    class Meta:
        ordering = ["environment", "-number"]
        constraints = [
            models.UniqueConstraint(
                fields=["environment", "number"], name="snapshot_unique_number"
            ),
            models.UniqueConstraint(fields=["environment", "label"], name="snapshot_unique_label"),
            models.CheckConstraint(condition=Q(number__gte=1), name="snapshot_number_positive"),
            models.CheckConstraint(
                condition=Q(state__in=["ready", "invalid"]), name="snapshot_state_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.environment.full_name} #{self.number} ({self.label})"

    @property
    def is_ready(self) -> bool:
        return self.state == self.State.READY


class Publication(models.Model):
    """One request to publish (or roll back): rendered by a worker, then it points
    at the snapshot it produced, or at the identical one that already existed."""

    class Kind(models.TextChoices):
        PUBLISH = "publish", "Publish"
        ROLLBACK = "rollback", "Rollback"

    class State(models.TextChoices):
        RENDERING = "rendering", "Rendering"
        READY = "ready", "Ready"
        INVALID = "invalid", "Invalid"
        # A publication requested later finished first: this one's inputs are older.
        SUPERSEDED = "superseded", "Superseded"

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    environment = models.ForeignKey(
        Environment, on_delete=models.CASCADE, related_name="publications"
    )
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PUBLISH)
    state = models.CharField(max_length=16, choices=State.choices, default=State.RENDERING)
    source = models.JSONField()
    # The audit event of this request: orders publications by when their inputs
    # were captured, and delimits pending changes.
    inputs_audit_id = models.BigIntegerField(null=True, blank=True)
    rolled_back_from = models.ForeignKey(
        Snapshot, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    snapshot = models.ForeignKey(
        Snapshot, null=True, blank=True, on_delete=models.CASCADE, related_name="+"
    )
    deduplicated = models.BooleanField(default=False)
    # Whether its snapshot becomes active when stored, as the release policy said
    # when it was requested (a rollback always does; a staged environment does not).
    activates = models.BooleanField(default=False)
    # Whether it did, once finished (None while rendering): a duplicate, an invalid
    # render, quarantined content or an active rollout activate nothing.
    activated = models.BooleanField(null=True, blank=True)
    # The degenerate-render guard: the requester confirmed emptied files or a sharp
    # shrink up front; else a snapshot that has them is stored and not activated,
    # held with the findings ({against, emptied, shrink}) until someone confirms.
    confirmed = models.BooleanField(default=False)
    needs_confirmation = models.JSONField(null=True, blank=True)
    # The release gate's refusal when its snapshot, meant to become active, was
    # stored and not activated ({code, message, details}): approvals needed (a
    # release asking to activate it was submitted), a freeze (docs/governance.md).
    held = models.JSONField(null=True, blank=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    # When a worker took the render (committed before it renders): the row is the
    # outbox of its render task, and beat queues the task again while it sits
    # unclaimed, or once a claim is older than a render may run (its worker died).
    claimed_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=Q(state="rendering") | Q(snapshot__isnull=False),
                name="publication_finished_has_snapshot",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.environment_id} {self.state}"


class ActiveContent(models.Model):
    """Content (by checksum, whatever the number of the snapshot holding it) that
    has been an environment's active content: what an environment rollback restores
    without a new approval (docs/governance.md). Written when a snapshot is
    activated (apps.fleet.services.environment_activate); kept when retention
    removes the snapshot."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE, related_name="+")
    checksum = models.CharField(max_length=71)
    first_number = models.PositiveIntegerField(
        help_text="The snapshot that first made this content active.")
    first_active_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["environment", "checksum"],
                                               name="active_content_unique")]

    def __str__(self) -> str:
        return f"{self.checksum[:19]} active in {self.environment_id} since #{self.first_number}"
