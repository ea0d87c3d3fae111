"""Audit events: every change, with who did it, to what, in which environment."""

from django.conf import settings
from django.db import models


class Action(models.TextChoices):
    """What an audit event records. Stored as its value; never a free string."""

    TENANT_CREATE = "tenant.create"
    TENANT_UPDATE = "tenant.update"
    MEMBERSHIP_SET = "membership.set"
    MEMBERSHIP_REMOVE = "membership.remove"
    APPLICATION_CREATE = "application.create"
    APPLICATION_UPDATE = "application.update"
    API_TOKEN_CREATE = "api_token.create"
    API_TOKEN_REVOKE = "api_token.revoke"
    POLICY_PUBLISH = "policy.publish"
    ENVIRONMENT_CREATE = "environment.create"
    ENVIRONMENT_UPDATE = "environment.update"  # its config or schema
    ENVIRONMENT_SETTINGS = "environment.settings"  # poll interval, policies, keeping pins
    ENVIRONMENT_OWNERS = "environment.owners"
    TEMPLATE_CREATE = "template.create"
    TEMPLATE_UPDATE = "template.update"
    TEMPLATE_DELETE = "template.delete"
    FALLBACK_CREATE = "fallback.create"
    FALLBACK_UPDATE = "fallback.update"
    FALLBACK_DELETE = "fallback.delete"
    PUBLICATION_CREATE = "publication.create"
    SNAPSHOT_CREATE = "snapshot.create"
    SNAPSHOT_INVALID = "snapshot.invalid"
    SNAPSHOT_ROLLBACK = "snapshot.rollback"
    SNAPSHOT_ACTIVATE = "snapshot.activate"
    SNAPSHOT_DEPLOY = "snapshot.deploy"
    SNAPSHOT_PROMOTE = "snapshot.promote"  # another environment's release published here
    SNAPSHOT_REMOVE = "snapshot.remove"  # by retention (beat) or an owner, with a reason
    PUBLICATION_CONFIRM = "publication.confirm"  # a degenerate render released by a person
    ENROLLMENT_TOKEN_CREATE = "enrollment_token.create"
    ENROLLMENT_TOKEN_REVOKE = "enrollment_token.revoke"
    AGENT_ENROLL = "agent.enroll"
    AGENT_UPDATE = "agent.update"
    AGENT_TOKEN_ROTATE = "agent.token_rotate"
    AGENT_TOKEN_REVOKE = "agent.token_revoke"
    AGENT_PIN = "agent.pin"
    AGENT_PIN_RELEASE = "agent.pin_release"
    AGENT_DECOMMISSION = "agent.decommission"
    AGENT_DRIFT = "agent.drift"  # hand edits of managed files found, changed or cleared
    ROLLOUT_CREATE = "rollout.create"
    ROLLOUT_ADVANCE = "rollout.advance"
    ROLLOUT_PAUSE = "rollout.pause"
    ROLLOUT_RESUME = "rollout.resume"
    ROLLOUT_COMPLETE = "rollout.complete"
    ROLLOUT_ROLLBACK = "rollout.rollback"
    ROLLOUT_RELEASE = "rollout.release"
    ROLLOUT_PINS_RELEASE = "rollout.pins_release"
    ROLLOUT_DELETE = "rollout.delete"
    QUARANTINE_OVERRIDE = "quarantine.override"  # an owner released quarantined content
    QUARANTINE_LIFT = "quarantine.lift"
    ENVIRONMENT_RESET = "environment.reset"  # inputs reset to the active snapshot's source
    STRATEGY_CREATE = "strategy.create"
    STRATEGY_DELETE = "strategy.delete"
    STRATEGY_DEFAULT = "strategy.default"  # an environment's default strategy set or cleared
    WEBHOOK_CREATE = "webhook.create"
    WEBHOOK_UPDATE = "webhook.update"  # its events, enabled, or a new secret
    WEBHOOK_DELETE = "webhook.delete"
    APPROVAL_RULE_SET = "governance.rule"  # an environment's approval rule
    RELEASE_SUBMIT = "release.submit"  # a release (snapshot + plan) asks for approval
    RELEASE_UPDATE = "release.update"  # its snapshot or plan changed: approvals cancelled
    RELEASE_APPROVE = "release.approve"
    RELEASE_REJECT = "release.reject"
    RELEASE_SKIP = "release.skip"  # a platform admin skipped the approvals, with a reason
    RELEASE_WITHDRAW = "release.withdraw"
    RELEASE_USE = "release.use"  # an approved release started (activation, push, rollout)
    WINDOW_CREATE = "window.create"  # a freeze or an allow window
    WINDOW_DELETE = "window.delete"
    FREEZE_OVERRIDE = "freeze.override"  # an owner's emergency override, with a reason
    ROLLOUT_HELD = "rollout.held"  # reconcile held a wave advance (a freeze)
    SCHEDULE_CREATE = "schedule.create"
    SCHEDULE_CANCEL = "schedule.cancel"
    SCHEDULE_START = "schedule.start"
    SCHEDULE_FAIL = "schedule.fail"  # it did not start, and says why

    @classmethod
    def file_change(cls, kind: str, change: str) -> "Action":
        """The action of a template or fallback file being created, updated or deleted."""
        return cls(f"{kind}.{change}")

    @property
    def changes_render_inputs(self) -> bool:
        """Whether the change is to what a snapshot is rendered from (the config,
        its schema, templates, fallback files): those wait in "pending changes"
        until a snapshot holds them. Settings, owners, agents, tokens and
        releases do not wait for a rollout."""
        return self.value.split(".")[0] in ("template", "fallback") or self in (
            Action.ENVIRONMENT_CREATE, Action.ENVIRONMENT_UPDATE)


RENDER_INPUTS = frozenset(action for action in Action if action.changes_render_inputs)


class AuditEventQuerySet(models.QuerySet):
    def render_inputs(self) -> "AuditEventQuerySet":
        """Events that changed what a snapshot is rendered from."""
        return self.filter(action__in=RENDER_INPUTS)


class AuditEvent(models.Model):
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    actor_name = models.CharField(max_length=150, blank=True)
    action = models.CharField(max_length=64, db_index=True, choices=Action.choices)
    object_type = models.CharField(max_length=64)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    tenant = models.ForeignKey(
        "tenancy.Tenant", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    environment = models.ForeignKey(
        "environments.Environment",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="audit_events",
    )
    summary = models.CharField(max_length=500, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        indexes = [models.Index(fields=["environment", "id"], name="audit_env_id_idx")]

    def __str__(self) -> str:
        return f"{self.action} {self.object_repr}"
