"""The governance API's input and output shapes (apps.governance.api)."""

from django.utils import timezone
from rest_framework import serializers

from apps.core.fields import LabelsField, NameField, WholeNumberField
from apps.governance import rules
from apps.governance.models import ReleaseRequest, ReleaseWindow, ScheduledRelease

BIG = 2**63 - 1


class RuleSerializer(serializers.Serializer):
    required_approvals = WholeNumberField(min_value=0, max_value=10)
    owners_approve = serializers.BooleanField(default=True)
    approver_groups = serializers.ListField(child=NameField(max_length=150), default=list,
                                            max_length=50)
    admins_may_skip = serializers.BooleanField(default=False)
    strict = serializers.BooleanField(default=False)
    expected_version = WholeNumberField(min_value=1, required=False)


class WaveSerializer(serializers.Serializer):
    percent = WholeNumberField(min_value=1, max_value=100, required=False)
    count = WholeNumberField(min_value=1, required=False)
    gate = serializers.ChoiceField(rules.GATE_CHOICES, default=rules.AUTO)
    bake_s = WholeNumberField(min_value=0, max_value=7 * 86400, default=0)
    # The wave's own limits (apps.rollouts.inflight): part of what is approved.
    max_in_flight = WholeNumberField(min_value=1, max_value=10_000, required=False)
    max_failures = WholeNumberField(min_value=1, max_value=10_000, required=False)

    def validate(self, attrs):
        if ("percent" in attrs) == ("count" in attrs):
            raise serializers.ValidationError("Give a wave a percent or a count.")
        return attrs


class PlanSerializer(serializers.Serializer):
    """A release's plan: `activate`, `push` (to `agents`, or all), or `rollout` with
    the fields a rollout takes (POST /environments/.../rollouts), `targets` as ids."""

    kind = serializers.ChoiceField(rules.PLAN_KINDS)
    agents = serializers.ListField(child=WholeNumberField(min_value=1, max_value=BIG),
                                   required=False, max_length=10_000)
    targets = serializers.ListField(child=WholeNumberField(min_value=1, max_value=BIG),
                                    required=False, max_length=100_000)
    canary_agents = serializers.ListField(child=WholeNumberField(min_value=1, max_value=BIG),
                                          required=False, max_length=10_000)
    canary_labels = LabelsField(child=NameField(), required=False)
    canary_gate = serializers.ChoiceField(rules.GATE_CHOICES, default=rules.MANUAL)
    bake_s = WholeNumberField(min_value=0, max_value=7 * 86400, default=0)
    waves = WaveSerializer(many=True, required=False, max_length=50)
    failure_threshold = WholeNumberField(min_value=0, max_value=100_000, default=0)
    wave_timeout_s = WholeNumberField(min_value=60, max_value=7 * 86400, default=3600)

    def validate(self, attrs):
        if attrs["kind"] == rules.ROLLOUT and not (attrs.get("canary_agents")
                                                   or attrs.get("canary_labels")):
            raise serializers.ValidationError(
                {"canary_agents": "A rollout's plan names its canaries: agent ids or labels."})
        return attrs

    def plan(self) -> dict:
        v = self.validated_data
        if v["kind"] == rules.ACTIVATE:
            return rules.activation_plan()
        if v["kind"] == rules.PUSH:
            return rules.push_plan(v.get("agents"))
        return rules.rollout_plan(
            targets=v.get("targets"), canary_agents=v.get("canary_agents"),
            canary_labels=v.get("canary_labels"), waves=v.get("waves"),
            canary_gate=v["canary_gate"], bake_s=v["bake_s"],
            failure_threshold=v["failure_threshold"], wave_timeout_s=v["wave_timeout_s"])


class ReleaseSubmitSerializer(serializers.Serializer):
    snapshot = WholeNumberField(min_value=1, max_value=2**31 - 1)
    plan = PlanSerializer()
    note = serializers.CharField(required=False, allow_blank=True, max_length=2000, default="")


class ReleaseUpdateSerializer(serializers.Serializer):
    expected_version = WholeNumberField(min_value=1)
    snapshot = WholeNumberField(min_value=1, max_value=2**31 - 1, required=False)
    plan = PlanSerializer(required=False)


class DecisionSerializer(serializers.Serializer):
    checksum = serializers.CharField(max_length=71)
    plan_digest = serializers.CharField(max_length=64)
    comment = serializers.CharField(required=False, allow_blank=True, max_length=2000,
                                    default="")


class SkipReasonSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=500)


class OverrideSerializer(SkipReasonSerializer):
    minutes = WholeNumberField(min_value=1, max_value=24 * 60, default=60)


class OffsetMomentField(serializers.DateTimeField):
    """A moment with its UTC offset (`Z` or `+02:00`). One without is refused (400
    naming the field), never read in the server's timezone: a release starts at the
    moment its author meant or not at all (docs/governance.md)."""

    default_error_messages = {"naive": "A moment with its UTC offset, e.g. "
                                       "2026-06-01T09:00:00+02:00 or 2026-06-01T07:00:00Z."}

    def enforce_timezone(self, value):
        if timezone.is_naive(value):
            self.fail("naive")
        return super().enforce_timezone(value)


class ScheduleSerializer(serializers.Serializer):
    run_at = OffsetMomentField()
    expected_version = WholeNumberField(min_value=1)
    confirm = serializers.BooleanField(
        default=False, help_text="Start it even if its snapshot is a degenerate render "
                                 "against the active snapshot (a file that had content "
                                 "emptied, or a sharp shrink), as the immediate action's "
                                 "`confirm`: it covers the content checked now, which the "
                                 "compare-and-set keeps. Without it such a start fails "
                                 "with confirmation_required.")


class MomentField(serializers.DateTimeField):
    """A moment as given: with its offset, or a wall-clock time without one, which
    the window's own timezone reads (apps.governance.windows), not the server's."""

    def enforce_timezone(self, value):
        return value


class WindowInputSerializer(serializers.Serializer):
    kind = serializers.ChoiceField(ReleaseWindow.Kind.choices)
    name = NameField(max_length=100)
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500, default="")
    timezone = serializers.CharField(max_length=64, default="UTC")
    starts_at = MomentField(required=False)
    ends_at = MomentField(required=False)
    weekdays = serializers.ListField(child=WholeNumberField(min_value=0, max_value=6),
                                     required=False, max_length=7)
    start_time = serializers.TimeField(required=False)
    end_time = serializers.TimeField(required=False)


class WindowSerializer(serializers.ModelSerializer):
    class Meta:
        model = ReleaseWindow
        fields = ["id", "kind", "name", "reason", "timezone", "starts_at", "ends_at",
                  "weekdays", "start_time", "end_time", "created_at"]


class ReleaseRequestSerializer(serializers.ModelSerializer):
    environment = serializers.CharField(source="environment.full_name")
    snapshot = WholeNumberField(source="snapshot.number")
    requested_by = serializers.CharField(source="requested_by.username", allow_null=True,
                                         default=None)
    skipped_by = serializers.CharField(source="skipped_by.username", allow_null=True,
                                       default=None)

    class Meta:
        model = ReleaseRequest
        fields = ["id", "environment", "snapshot", "checksum", "plan", "plan_digest", "state",
                  "version", "rule", "note", "requested_by", "skipped_by", "skip_reason",
                  "created_at", "released_at"]


class ScheduledReleaseSerializer(serializers.ModelSerializer):
    expected_active_snapshot = WholeNumberField(source="expected_active_snapshot.number",
                                                allow_null=True, default=None)

    class Meta:
        model = ScheduledRelease
        fields = ["id", "release", "run_at", "state", "expected_active_snapshot",
                  "expected_release_version", "confirmed", "outcome_code", "outcome",
                  "result", "created_at", "finished_at"]


# --- response shapes (for the schema) --------------------------------------------------


class GovernanceStatusSerializer(serializers.Serializer):
    environment = serializers.CharField()
    rule = serializers.DictField()
    governed = serializers.BooleanField()
    frozen = serializers.DictField(allow_null=True, help_text="What holds releases now, or null.")
    override = serializers.DictField(allow_null=True)


class RuleOutSerializer(serializers.Serializer):
    environment = serializers.CharField()
    rule = serializers.DictField()


class ReleaseDetailSerializer(ReleaseRequestSerializer):
    """A release with what it still lacks and its decisions (cancelled ones too)."""

    missing = serializers.DictField(allow_null=True, read_only=True)
    decisions = serializers.ListField(child=serializers.DictField(), read_only=True)

    class Meta(ReleaseRequestSerializer.Meta):
        fields = [*ReleaseRequestSerializer.Meta.fields, "missing", "decisions"]


class ReleaseListSerializer(serializers.Serializer):
    results = ReleaseRequestSerializer(many=True)


class WindowListSerializer(serializers.Serializer):
    results = WindowSerializer(many=True)
    frozen = serializers.DictField(allow_null=True)


class ScheduleListSerializer(serializers.Serializer):
    results = ScheduledReleaseSerializer(many=True)


class OverrideOutSerializer(serializers.Serializer):
    id = WholeNumberField()
    reason = serializers.CharField()
    starts_at = serializers.DateTimeField()
    ends_at = serializers.DateTimeField()
