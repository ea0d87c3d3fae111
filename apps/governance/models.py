"""Governance of releases (docs/governance.md): per-environment approval rules,
release requests bound to content (a snapshot's checksum and a plan), approvals,
freezes and allow windows, emergency overrides, and scheduled releases. Kept here,
keyed by environment: the environment's own fields are not governance's."""

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import models
from django.db.models import Q

from apps.core import locks
from apps.environments.models import Environment
from apps.snapshots.models import Snapshot


class ApprovalRule(models.Model):
    """What releasing in an environment needs. No rule, or 0 approvals: ungoverned."""

    environment = models.OneToOneField(Environment, on_delete=models.CASCADE,
                                       related_name="approval_rule")
    required_approvals = models.PositiveSmallIntegerField(
        default=0, help_text="Approvals a release needs (0: none).")
    owners_approve = models.BooleanField(
        default=True, help_text="The environment's owners may approve.")
    approver_groups = models.ManyToManyField(
        Group, blank=True, related_name="+", help_text="Members of these groups may approve.")
    admins_may_skip = models.BooleanField(
        default=False, help_text="Platform admins (superusers) may skip the approvals, "
                                 "with a reason.")
    strict = models.BooleanField(
        default=False, help_text="Releases are held to the rule in force now, not to the "
                                 "rule they were submitted under.")
    version = models.PositiveIntegerField(default=1, editable=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(required_approvals__lte=10),
                                              name="approval_rule_required_range")]

    def __str__(self) -> str:
        return f"{self.required_approvals} approval(s) for {self.environment}"


class ReleaseRequestQuerySet(models.QuerySet):
    def lock(self, pk: int) -> "ReleaseRequest | None":
        return locks.lock_first(self.select_related("snapshot", "environment").filter(pk=pk))


class ReleaseRequest(models.Model):
    """A release asking for approval: a snapshot and its plan (activate, push, or a
    rollout's waves), the rule in force when it was submitted, and its decisions."""

    class State(models.TextChoices):
        OPEN = "open", "Open"
        REJECTED = "rejected", "Rejected"
        RELEASED = "released", "Released"
        WITHDRAWN = "withdrawn", "Withdrawn"

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="release_requests")
    snapshot = models.ForeignKey(Snapshot, on_delete=models.PROTECT, related_name="+")
    checksum = models.CharField(max_length=71)
    plan = models.JSONField()
    plan_digest = models.CharField(max_length=64)
    rule = models.JSONField(help_text="The approval rule as it was at submission.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.OPEN)
    # Bumped when the snapshot or the plan changes (every approval given is cancelled).
    version = models.PositiveIntegerField(default=1)
    note = models.TextField(blank=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                     on_delete=models.SET_NULL, related_name="+")
    # Who changed its snapshot or plan since: authors of the content too, so never
    # its approvers (docs/governance.md).
    editors = models.ManyToManyField(settings.AUTH_USER_MODEL, blank=True, related_name="+")
    skipped_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    skip_reason = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    released_at = models.DateTimeField(null=True, blank=True)

    objects = ReleaseRequestQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "snapshot", "plan_digest"],
                                    condition=Q(state="open"),
                                    name="release_request_one_open_per_content"),
            models.CheckConstraint(
                condition=Q(state__in=["open", "rejected", "released", "withdrawn"]),
                name="release_request_state_valid"),
        ]

    def __str__(self) -> str:
        return f"release {self.pk} of #{self.snapshot.number} ({self.plan.get('kind')})"


class Approval(models.Model):
    """One person's decision on a release, naming the content they saw."""

    class Decision(models.TextChoices):
        APPROVE = "approve", "Approve"
        REJECT = "reject", "Reject"

    release = models.ForeignKey(ReleaseRequest, on_delete=models.CASCADE,
                                related_name="approvals")
    approver = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                                 related_name="+")
    decision = models.CharField(max_length=8, choices=Decision.choices)
    checksum = models.CharField(max_length=71)
    plan_digest = models.CharField(max_length=64)
    comment = models.TextField(blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            models.UniqueConstraint(fields=["release", "approver"],
                                    condition=Q(cancelled_at__isnull=True),
                                    name="approval_one_standing_per_approver"),
        ]

    def __str__(self) -> str:
        return f"{self.decision} by {self.approver_id} on release {self.release_id}"


class ReleaseWindow(models.Model):
    """A freeze (nothing starts inside it) or an allow window (when any exists,
    releases start only inside one): once (`starts_at`..`ends_at`) or weekly
    (`weekdays`, Monday 0, from `start_time` to `end_time` in `timezone`; an end at or
    before the start runs past midnight)."""

    class Kind(models.TextChoices):
        FREEZE = "freeze", "Freeze (deny)"
        ALLOW = "allow", "Allow window"

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="release_windows")
    kind = models.CharField(max_length=8, choices=Kind.choices)
    name = models.CharField(max_length=100)
    reason = models.TextField(blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    weekdays = models.JSONField(default=list, blank=True)
    start_time = models.TimeField(null=True, blank=True)
    end_time = models.TimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["kind", "name"]
        constraints = [
            models.UniqueConstraint(fields=["environment", "name"],
                                    name="release_window_unique_name"),
            models.CheckConstraint(condition=Q(kind__in=["freeze", "allow"]),
                                   name="release_window_kind_valid"),
            models.CheckConstraint(
                condition=(Q(starts_at__isnull=False, ends_at__isnull=False,
                             start_time__isnull=True, end_time__isnull=True)
                           | Q(starts_at__isnull=True, ends_at__isnull=True,
                               start_time__isnull=False, end_time__isnull=False)),
                name="release_window_once_or_weekly"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name}"

    @property
    def is_weekly(self) -> bool:
        return self.start_time is not None


class FreezeOverride(models.Model):
    """An owner's emergency override: freezes and allow windows do not hold releases
    of the environment from `starts_at` to `ends_at`."""

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="freeze_overrides")
    reason = models.TextField()
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        ordering = ["-starts_at"]

    def __str__(self) -> str:
        return f"override of {self.environment_id} until {self.ends_at:%Y-%m-%d %H:%M}"


class ScheduledReleaseQuerySet(models.QuerySet):
    def due(self, at) -> "ScheduledReleaseQuerySet":
        return self.filter(state="scheduled", run_at__lte=at)


class ScheduledRelease(models.Model):
    """A release to start at `run_at`, only if nothing changed since it was
    scheduled: the environment's active snapshot and the release's version."""

    class State(models.TextChoices):
        SCHEDULED = "scheduled", "Scheduled"
        STARTED = "started", "Started"
        FAILED = "failed", "Failed"
        CANCELLED = "cancelled", "Cancelled"

    environment = models.ForeignKey(Environment, on_delete=models.CASCADE,
                                    related_name="scheduled_releases")
    release = models.ForeignKey(ReleaseRequest, on_delete=models.CASCADE,
                                related_name="schedules")
    run_at = models.DateTimeField()
    expected_active_snapshot = models.ForeignKey(Snapshot, null=True, blank=True,
                                                 on_delete=models.PROTECT, related_name="+")
    expected_release_version = models.PositiveIntegerField()
    # Its scheduler accepted a degenerate render (the immediate action's `confirm`)
    # of the content checked when scheduling; the compare-and-set keeps it that content.
    confirmed = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=State.choices, default=State.SCHEDULED)
    outcome_code = models.CharField(max_length=64, blank=True)
    outcome = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = ScheduledReleaseQuerySet.as_manager()

    class Meta:
        ordering = ["run_at", "pk"]
        indexes = [models.Index(fields=["state", "run_at"], name="scheduled_release_due_idx")]
        constraints = [models.CheckConstraint(
            condition=Q(state__in=["scheduled", "started", "failed", "cancelled"]),
            name="scheduled_release_state_valid")]

    def __str__(self) -> str:
        return f"release {self.release_id} at {self.run_at:%Y-%m-%d %H:%M} ({self.state})"
