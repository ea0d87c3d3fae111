"""Agents, the tokens that enroll them, and deployments of snapshots onto them."""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.core import locks
from apps.core.validators import validate_name_text
from apps.environments.models import Environment
from apps.fleet import rules
from apps.snapshots.models import Snapshot

# The rule of apps.fleet.rules.is_held, for the database.
HELD = Q(pinned_snapshot__isnull=False) | Q(pin_rollout__isnull=False)
# Hand-edited managed files, not restored by the agent (apps.fleet.drift).
DRIFTED = Q(drift_seen_at__isnull=False, drift_restored=False)


class EnrollmentToken(models.Model):
    """Exchanged once per agent for its own token; scoped to one environment."""

    environment = models.ForeignKey(
        Environment, on_delete=models.CASCADE, related_name="enrollment_tokens"
    )
    name = models.CharField(max_length=100, blank=True, validators=[validate_name_text])
    key = models.CharField(max_length=16, unique=True, editable=False)
    secret_hash = models.CharField(max_length=64, editable=False)
    max_uses = models.PositiveIntegerField(default=1)
    uses = models.PositiveIntegerField(default=0, editable=False)
    expires_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(condition=Q(uses__lte=models.F("max_uses")),
                                   name="enrollment_token_uses_within_max"),
            models.CheckConstraint(condition=Q(max_uses__gte=1),
                                   name="enrollment_token_max_uses_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.key} for {self.environment}"


class AgentQuerySet(models.QuerySet):
    def held(self) -> "AgentQuerySet":
        return self.filter(HELD)

    def following_active(self) -> "AgentQuerySet":
        """The agents in service that follow the environment's active snapshot."""
        return self.in_service().filter(mode=Agent.Mode.AUTO_PULL).exclude(HELD)

    def in_service(self) -> "AgentQuerySet":
        """Agents not decommissioned: what targets, counts and lists take by default."""
        return self.filter(decommissioned_at__isnull=True)

    def drifted(self) -> "AgentQuerySet":
        """Agents whose managed files were hand-edited and are not restored."""
        return self.filter(DRIFTED)

    def decommissioned(self) -> "AgentQuerySet":
        return self.filter(decommissioned_at__isnull=False)

    def lock(self, pk: int) -> "Agent":
        return locks.lock_one(self, pk=pk)

    def lock_all(self) -> list:
        return locks.lock_all(self)


class Agent(models.Model):
    class Mode(models.TextChoices):
        AUTO_PULL = "auto_pull", "Auto pull (follow the active snapshot)"
        MANUAL = "manual", "Manual (follow pushes only)"

    environment = models.ForeignKey(Environment, on_delete=models.PROTECT, related_name="agents")
    name = models.CharField(max_length=100, validators=[validate_name_text])
    labels = models.JSONField(default=dict, blank=True)
    enabled = models.BooleanField(default=True)
    mode = models.CharField(max_length=16, choices=Mode.choices, default=Mode.AUTO_PULL)
    target_snapshot = models.ForeignKey(
        Snapshot, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        db_index=False, help_text="What a manual agent follows: the snapshot last pushed to it.",
    )
    # A pin wins over everything else: an operator's hold (later also a rollout's).
    pinned_snapshot = models.ForeignKey(
        Snapshot, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
        db_index=False,
    )
    pinned_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+", db_index=False,
    )
    pinned_at = models.DateTimeField(null=True, blank=True)
    # Set when the pin is a rollout's (then released by the rollout or with its id).
    pin_rollout = models.ForeignKey(
        "rollouts.Rollout", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        db_index=False,
    )
    # Bumped on every change of the agent's desired state (CAS for operators).
    generation = models.PositiveBigIntegerField(default=1)
    token_key = models.CharField(max_length=16, editable=False)  # unique: Meta
    token_hash = models.CharField(max_length=64, editable=False)
    token_revoked_at = models.DateTimeField(null=True, blank=True, editable=False)
    # What the agent applied, only ever from its reports.
    applied_number = models.PositiveIntegerField(null=True, blank=True)
    applied_checksum = models.CharField(max_length=71, blank=True)
    last_status = models.CharField(max_length=16, blank=True)
    last_message = models.TextField(blank=True)
    last_report_at = models.DateTimeField(null=True, blank=True)
    # The health probe's result in the last report, when the agent probes (see Deployment).
    last_health = models.JSONField(null=True, blank=True)
    blocked_number = models.PositiveIntegerField(null=True, blank=True)
    blocked_checksum = models.CharField(max_length=71, blank=True)
    # Managed files that no longer match the applied snapshot, as the agent last
    # reported them ([{path, change, summary}]; empty when not drifted), since when,
    # and whether the agent restored the snapshot's files (the restore drift policy).
    drift = models.JSONField(default=list, blank=True)
    drift_seen_at = models.DateTimeField(null=True, blank=True)
    drift_restored = models.BooleanField(default=False)
    # Flushed from the cache in batches; polls do not write the database.
    last_seen_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set once when an owner decommissions the agent: its token is revoked, its
    # history kept, and its name free for a new agent of the environment.
    decommissioned_at = models.DateTimeField(null=True, blank=True, editable=False)

    objects = AgentQuerySet.as_manager()

    class Meta:
        ordering = ["environment", "name"]
        constraints = [
            # Unique among the agents in service: a decommissioned agent's name is free.
            models.UniqueConstraint(fields=["environment", "name"],
                                    condition=Q(decommissioned_at__isnull=True),
                                    name="agent_unique_name_in_service"),
            models.CheckConstraint(condition=Q(mode__in=["auto_pull", "manual"]),
                                   name="agent_mode_valid"),
            # A constraint, not unique=True: no second (LIKE) index to write.
            models.UniqueConstraint(fields=["token_key"], name="agent_token_key_unique"),
        ]
        # A rollout step rewrites the pins of ten thousand agents at once: the
        # columns it writes (pinned_snapshot, pin_rollout) are not indexed, so
        # each row is rewritten on its own page with no index entry (the table
        # keeps room for that: apps.core.storage). Deleting a snapshot or a
        # rollout scans the agents instead. The others index only set values.
        indexes = [
            models.Index(fields=[field], condition=Q(**{f"{field}__isnull": False}),
                         name=f"agent_{field}_set")
            for field in ("target_snapshot", "pinned_by")
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.environment})"

    @property
    def is_held(self) -> bool:
        return rules.is_held(self)

    @property
    def is_decommissioned(self) -> bool:
        return self.decommissioned_at is not None


class Deployment(models.Model):
    """One push (announced to the agent by id) or one pulled apply (from its report)."""

    class Kind(models.TextChoices):
        PUSH = "push", "Push"
        PULL = "pull", "Pull"

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        SUCCEEDED = "succeeded", "Succeeded"
        WARNING = "warning", "Warning"
        FAILED = "failed", "Failed"
        SUPERSEDED = "superseded", "Superseded"

    REPORTED_STATES = (State.SUCCEEDED, State.WARNING, State.FAILED)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="deployments")
    snapshot = models.ForeignKey(Snapshot, on_delete=models.PROTECT, related_name="+")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    message = models.TextField(blank=True)
    reported_checksum = models.CharField(max_length=71, blank=True)
    # {ok, attempts, output, probe}: the agent's health probe after its reload, when it
    # runs one (docs/agents.md); null when no probe ran.
    health = models.JSONField(null=True, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    reported_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            models.Index(fields=["agent", "state"], name="deployment_agent_state_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(state__in=["pending", "succeeded", "warning", "failed",
                                       "superseded"]),
                name="deployment_state_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} #{self.snapshot.number} to {self.agent.name}: {self.state}"


class PollInvalidation(models.Model):
    """Agents' cached poll answers a change made stale, written in the change's
    transaction, so the debt survives a failing cache and the death of the process
    that committed it. Until a sweep settles it (drops the keys from the cache at
    least POLL_DEBT_GRACE_S after first seeing it, then deletes the row), polls with
    these token keys are answered from the database (apps.fleet.polldebt), unless the
    change named the generation each agent reached (`generations`) and the cached
    answer was computed at that generation or later."""

    token_keys = models.JSONField()
    # Token key -> the agent's generation after the change (its cached answer is
    # refilled on commit, apps.fleet.services.refresh_polls_on_commit); null: no
    # cached answer of these keys is trusted until the row is settled.
    generations = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # When a sweep first saw the row (committed): the grace period starts here.
    seen_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self) -> str:
        return f"poll invalidation {self.pk} ({len(self.token_keys)} token(s))"
