"""Staged rollouts (docs/rollouts.md): a snapshot rolled out in waves, canaries first, with
gates, pins on every target, and rollback to a new, higher snapshot."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from apps.core import locks
from apps.environments.models import Environment
from apps.fleet.models import Agent
from apps.snapshots.models import Snapshot

ACTIVE_STATES = ("running", "paused")


class RolloutQuerySet(models.QuerySet):
    def active(self) -> "RolloutQuerySet":
        return self.filter(state__in=ACTIVE_STATES)

    def active_in(self, environment) -> "RolloutQuerySet":
        """The environment's active rollout (at most one: a constraint says so)."""
        return self.active().filter(environment=environment)

    def lock(self, pk: int) -> "Rollout | None":
        return locks.lock_first(self.select_related("snapshot", "environment").filter(pk=pk))


class Rollout(models.Model):
    class State(models.TextChoices):
        RUNNING = "running", "Running"
        PAUSED = "paused", "Paused"
        COMPLETED = "completed", "Completed"
        ROLLED_BACK = "rolled_back", "Rolled back"

    class Gate(models.TextChoices):
        MANUAL = "manual", "Manual confirm"
        AUTO = "auto", "Automatic"

    environment = models.ForeignKey(Environment, on_delete=models.PROTECT,
                                    related_name="rollouts")
    snapshot = models.ForeignKey(Snapshot, on_delete=models.PROTECT, related_name="+")
    # What the environment had active when the rollout began: a rollback re-renders it.
    previous_snapshot = models.ForeignKey(Snapshot, null=True, blank=True,
                                          on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.RUNNING)
    # Compare-and-set token for confirm and rollback: bumped on every transition.
    version = models.PositiveIntegerField(default=1)
    # [{"gate": "manual"|"auto", "bake_s": int, "size": int}], wave 0 the canaries.
    waves = models.JSONField()
    current_wave = models.PositiveIntegerField(default=0)
    wave_started_at = models.DateTimeField()
    wave_timeout_s = models.PositiveIntegerField(default=3600)
    failure_threshold = models.PositiveIntegerField(
        default=0, help_text="Failed targets tolerated; one more rolls back.")
    reason = models.TextField(blank=True)
    rollback_snapshot = models.ForeignKey(Snapshot, null=True, blank=True,
                                          on_delete=models.PROTECT, related_name="+")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Kept when the rollout finishes, before its pins are released: per wave
    # {targets, activated, acknowledged, failed, released} and the last evidence.
    final_summary = models.JSONField(null=True, blank=True)
    # The named strategy it started from, if any (its fields may have been overridden).
    strategy = models.ForeignKey("RolloutStrategy", null=True, blank=True,
                                 on_delete=models.SET_NULL, related_name="+")

    objects = RolloutQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["environment"],
                                    condition=Q(state__in=ACTIVE_STATES),
                                    name="rollout_one_active_per_environment"),
            models.CheckConstraint(
                condition=Q(state__in=["running", "paused", "completed", "rolled_back"]),
                name="rollout_state_valid"),
        ]

    def __str__(self) -> str:
        return f"rollout {self.pk} of #{self.snapshot.number} ({self.state})"

    @property
    def is_active(self) -> bool:
        return self.state in ACTIVE_STATES


class RolloutTarget(models.Model):
    """One agent of a rollout. Its pin (on the agent) holds it on `previous_snapshot`
    while pending and on the rollout's snapshot once activated."""

    class State(models.TextChoices):
        PENDING = "pending", "Pending"
        ACTIVATED = "activated", "Activated"
        RELEASED = "released", "Released"

    # Indexed by the unique (rollout, agent) constraint below: no index of its own.
    rollout = models.ForeignKey(Rollout, on_delete=models.CASCADE, related_name="targets",
                                db_index=False)
    agent = models.ForeignKey(Agent, on_delete=models.CASCADE, related_name="+")
    wave = models.PositiveIntegerField()
    previous_snapshot = models.ForeignKey(Snapshot, null=True, blank=True,
                                          on_delete=models.PROTECT, related_name="+")
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    activated_at = models.DateTimeField(null=True, blank=True)
    # The agent's generation once this target's pin was set: a later change of the
    # agent's desired state (e.g. a manual release) invalidates its acknowledgement.
    generation = models.PositiveBigIntegerField(default=0)

    class Meta:
        ordering = ["rollout", "wave", "agent"]
        constraints = [
            models.UniqueConstraint(fields=["rollout", "agent"], name="rollout_target_unique"),
        ]
        # Not the state: a wave's step rewrites its targets' state, and a row whose
        # indexed columns are unchanged is rewritten without index entries
        # (apps.core.storage).
        indexes = [models.Index(fields=["rollout", "wave"], name="rollout_target_wave_idx")]

    def __str__(self) -> str:
        return f"{self.agent_id} in wave {self.wave} ({self.state})"


class SnapshotQuarantine(models.Model):
    """Content a rollout rolled back, quarantined by its checksum in one environment:
    any snapshot of that environment with this checksum (whatever its number or the
    request that produced it) is not activated, pushed, pinned or rolled out again
    without an owner's override. `snapshot` and `rollout` say where it came from.
    Kept apart because snapshots are immutable; lifting it deletes the row."""

    # Snapshot.objects.quarantined() filters through `quarantines`.
    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="quarantines")
    checksum = models.CharField(max_length=71)
    snapshot = models.ForeignKey(Snapshot, on_delete=models.CASCADE,
                                 related_name="quarantines")
    rollout = models.ForeignKey(Rollout, null=True, blank=True, on_delete=models.SET_NULL,
                                related_name="+")
    reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["environment", "checksum"],
                                    name="quarantine_env_checksum_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.checksum[:19]} (#{self.snapshot.number}) quarantined"

    def as_dict(self) -> dict:
        """What the API and the dashboard show: which snapshot and rollout, why, when."""
        return {"snapshot": self.snapshot.number, "rollout": self.rollout_id,
                "reason": self.reason, "at": self.created_at}


class RolloutStrategy(models.Model):
    """A named way to roll out (docs/rollouts.md, "Strategies"): canaries, waves with
    their gates, bake times, max in flight and failure stops, a failure threshold and
    a wave timeout, as `definition` (checked by rules.strategy_problems). Built-in
    ones (no tenant) are seeded by a migration and read-only; a tenant's own are
    its owners'."""

    tenant = models.ForeignKey("tenancy.Tenant", null=True, blank=True,
                               on_delete=models.CASCADE, related_name="rollout_strategies")
    name = models.CharField(max_length=64)
    description = models.CharField(max_length=500, blank=True)
    definition = models.JSONField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name", "pk"]
        verbose_name_plural = "rollout strategies"
        constraints = [
            models.UniqueConstraint(fields=["tenant", "name"], condition=Q(tenant__isnull=False),
                                    name="strategy_tenant_name_unique"),
            models.UniqueConstraint(fields=["name"], condition=Q(tenant__isnull=True),
                                    name="strategy_builtin_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name if self.tenant_id else f"{self.name} (built-in)"

    @property
    def is_builtin(self) -> bool:
        return self.tenant_id is None


class EnvironmentStrategy(models.Model):
    """The strategy an environment's rollouts start from when they name none. Kept
    here, keyed by the environment, so that environments need no field for it."""

    environment = models.OneToOneField(Environment, on_delete=models.CASCADE,
                                       related_name="default_strategy")
    strategy = models.ForeignKey(RolloutStrategy, on_delete=models.PROTECT,
                                 related_name="defaults")
    set_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                               on_delete=models.SET_NULL, related_name="+")
    set_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "default rollout strategy"

    def __str__(self) -> str:
        return f"{self.environment}: {self.strategy}"
