"""Rollout API: create (from a named strategy or field by field), list, detail with
wave progress, confirm, pause, resume, rollback, delete, releasing a rollout's pin on
an agent and all of a finished rollout's pins; named strategies and an environment's
default."""

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import NotFound
from apps.core.fields import AgentReferenceField, LabelsField, NameField, WholeNumberField
from apps.core.scheduler import scheduler_late_since
from apps.environments.models import Environment
from apps.environments.selectors import require_role
from apps.environments.views import (
    EnvironmentAPIView,
    QuarantineOverrideSerializer,
    quarantine_override,
)
from apps.fleet.selectors import agent_ids_named
from apps.rollouts import pausing, rules, selectors, services, strategies
from apps.rollouts.models import Rollout, RolloutStrategy, RolloutTarget
from apps.snapshots.selectors import snapshot_get
from apps.tenancy.models import Role

MAX_TARGETS_SHOWN = 100


class WaveSpecSerializer(serializers.Serializer):
    percent = WholeNumberField(min_value=1, max_value=100, required=False)
    count = WholeNumberField(min_value=1, required=False)
    gate = serializers.ChoiceField(Rollout.Gate.choices, default=Rollout.Gate.AUTO)
    bake_s = WholeNumberField(min_value=0, max_value=7 * 86400, default=0)
    max_in_flight = WholeNumberField(min_value=1, max_value=10_000, required=False)
    max_failures = WholeNumberField(min_value=1, max_value=10_000, required=False)

    def validate(self, attrs):
        if ("percent" in attrs) == ("count" in attrs):
            raise serializers.ValidationError("Give a wave a percent or a count.")
        return attrs


class TargetSpecSerializer(serializers.Serializer):
    agent = AgentReferenceField()
    expected_generation = WholeNumberField(min_value=1)


class RolloutCreateSerializer(QuarantineOverrideSerializer):
    snapshot = WholeNumberField(min_value=1, max_value=2**31 - 1)
    targets = TargetSpecSerializer(many=True, required=False, max_length=100_000)
    canary_agents = serializers.ListField(child=AgentReferenceField(), required=False,
                                          max_length=10_000)
    canary_labels = LabelsField(child=NameField(), required=False)
    # Set or not: a field left out comes from the strategy (or the defaults).
    strategy = serializers.CharField(max_length=64, required=False)
    canary_count = WholeNumberField(min_value=1, max_value=10_000, required=False)
    canary_percent = WholeNumberField(min_value=1, max_value=100, required=False)
    canary_gate = serializers.ChoiceField(Rollout.Gate.choices, required=False)
    bake_s = WholeNumberField(min_value=0, max_value=7 * 86400, required=False)
    waves = WaveSpecSerializer(many=True, required=False, max_length=50)
    failure_threshold = WholeNumberField(min_value=0, max_value=100_000, required=False)
    wave_timeout_s = WholeNumberField(min_value=60, max_value=7 * 86400, required=False)


class ExpectedVersionSerializer(serializers.Serializer):
    expected_version = WholeNumberField(min_value=1)


class RolloutSerializer(serializers.ModelSerializer):
    environment = serializers.CharField(source="environment.full_name")
    snapshot = WholeNumberField(source="snapshot.number")
    rollback_snapshot = WholeNumberField(source="rollback_snapshot.number",
                                                 allow_null=True, default=None)
    waves = serializers.SerializerMethodField()
    strategy = serializers.CharField(source="strategy.name", allow_null=True, default=None)
    reason = serializers.SerializerMethodField()

    class Meta:
        model = Rollout
        fields = ["id", "environment", "snapshot", "strategy", "state", "version",
                  "current_wave", "waves",
                  "failure_threshold", "wave_started_at", "wave_timeout_s", "reason",
                  "rollback_snapshot", "created_at", "finished_at"]

    def get_reason(self, rollout) -> str:
        if "scheduler_late_since" not in self.context:  # once per response
            self.context["scheduler_late_since"] = scheduler_late_since()
        return rules.shown_reason(rollout, self.context["scheduler_late_since"])

    def get_waves(self, rollout) -> list[dict]:
        progress = self.context.get("progress", {}).get(rollout.pk, {})
        # A finished rollout's counts are those it kept when it finished: its
        # targets have been released since.
        kept = {w["index"]: w for w in (rollout.final_summary or {}).get("waves", [])}
        return [{**wave, "index": index, **progress.get(index, {}), **kept.get(index, {})}
                for index, wave in enumerate(rollout.waves)]


def _rollouts():
    return Rollout.objects.select_related("environment__application", "snapshot",
                                          "rollback_snapshot", "strategy")


def _detail(rollout: Rollout) -> dict:
    body = RolloutSerializer(rollout, context={"progress": selectors.wave_progress([rollout])}).data
    if rollout.is_active:
        evidence = selectors.wave_evidence(rollout)
        body["current_wave_evidence"] = {k: getattr(evidence, k)[:MAX_TARGETS_SHOWN] for k in (
            "acknowledged", "failed", "waiting", "released", "changed")}
        # Counted in full: the names above stop at MAX_TARGETS_SHOWN.
        body["waves"][rollout.current_wave].update(
            acknowledged=len(evidence.acknowledged), failed=len(evidence.failed))
        body["failures"] = selectors.failure_reports(rollout, MAX_TARGETS_SHOWN)
    else:
        summary = rollout.final_summary or {}
        body["final_evidence"] = summary.get("final_evidence")
        body["failures"] = summary.get("failures", [])
    body["pins_held"] = selectors.pins_held(rollout)
    targets = (RolloutTarget.objects.filter(rollout=rollout).select_related("agent")
               .order_by("wave", "agent__name")[:MAX_TARGETS_SHOWN])
    body["targets"] = [{"agent": t.agent_id, "name": t.agent.name, "wave": t.wave,
                        "state": t.state, "activated_at": t.activated_at,
                        "generation": t.generation} for t in targets]
    return body


class RolloutListApi(EnvironmentAPIView, ListAPIView):
    serializer_class = RolloutSerializer

    def get_queryset(self):
        return _rollouts().filter(environment=self.environment())

    def get_serializer_context(self):
        return {**super().get_serializer_context(),
                "progress": selectors.wave_progress(getattr(self, "_page", None) or [])}

    def paginate_queryset(self, queryset):
        self._page = super().paginate_queryset(queryset)
        return self._page

    @extend_schema(request=RolloutCreateSerializer, responses={201: RolloutSerializer},
                   summary="Start a staged rollout of a ready snapshot")
    def post(self, request, application, environment):
        env = self.environment(Role.DEPLOYER)
        data = RolloutCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        named = agent_ids_named(env, canary_agents=v.get("canary_agents"),
                                targets=[t["agent"] for t in v.get("targets") or []])
        if v.get("canary_agents") is not None:
            v["canary_agents"] = named["canary_agents"]
        for target, agent_id in zip(v.get("targets") or [], named["targets"], strict=True):
            target["agent"] = agent_id
        snapshot = snapshot_get(environment=env, number=v.pop("snapshot"))
        override_reason = quarantine_override(request, env, v)
        v.pop("override_quarantine"), v.pop("reason")
        confirmed = v.pop("confirm")
        strategy, options = strategies.rollout_options_for(env, v.pop("strategy", None), v)
        rollout = services.rollout_create(environment=env, snapshot=snapshot,
                                          actor=request.user, override_reason=override_reason,
                                          strategy=strategy, confirmed=confirmed, **options)
        return Response(_detail(_rollouts().get(pk=rollout.pk)),
                        status=status.HTTP_201_CREATED)


class _RolloutApi(EnvironmentAPIView):
    def rollout_for(self, required: Role) -> Rollout:
        rollout = _rollouts().filter(
            pk=self.kwargs["rollout_id"],
            environment__in=Environment.objects.visible_to(self.request.user)).first()
        if rollout is None:
            raise NotFound("Rollout not found.")
        require_role(user=self.request.user, environment=rollout.environment,
                     required=required)
        return rollout


class RolloutDetailApi(_RolloutApi):
    @extend_schema(responses=RolloutSerializer)
    def get(self, request, rollout_id):
        return Response(_detail(self.rollout_for(Role.VIEWER)))

    @extend_schema(responses={204: None}, summary="Delete a finished rollout without pins")
    def delete(self, request, rollout_id):
        services.rollout_delete(rollout=self.rollout_for(Role.DEPLOYER), actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class _RolloutTransitionApi(_RolloutApi):
    """A deployer's transition of a rollout at the version they saw (CAS)."""

    def transition(self, request, service, **options):
        rollout = self.rollout_for(Role.DEPLOYER)
        data = ExpectedVersionSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        service(rollout=rollout, actor=request.user,
                expected_version=data.validated_data["expected_version"], **options)
        return Response(_detail(_rollouts().get(pk=rollout.pk)))


class RolloutConfirmApi(_RolloutTransitionApi):
    @extend_schema(request=ExpectedVersionSerializer, responses=RolloutSerializer,
                   summary="Confirm the current wave (needs fresh, exact acknowledgements)")
    def post(self, request, rollout_id):
        return self.transition(request, services.rollout_confirm)


class RolloutRollbackApi(_RolloutTransitionApi):
    @extend_schema(request=ExpectedVersionSerializer, responses=RolloutSerializer,
                   summary="Roll back: the previous content as a new, higher snapshot")
    def post(self, request, rollout_id):
        return self.transition(request, services.rollout_rollback,
                               reason="rolled back by an operator")


class RolloutReleasePinsApi(_RolloutTransitionApi):
    @extend_schema(request=ExpectedVersionSerializer, responses=RolloutSerializer,
                   summary="Release every pin a finished rollout still holds")
    def post(self, request, rollout_id):
        return self.transition(request, services.rollout_pins_release)


class RolloutPauseApi(_RolloutTransitionApi):
    @extend_schema(request=ExpectedVersionSerializer, responses=RolloutSerializer,
                   summary="Pause a running rollout (the reconciler stops advancing it)")
    def post(self, request, rollout_id):
        return self.transition(request, pausing.rollout_pause)


class RolloutResumeApi(_RolloutTransitionApi):
    @extend_schema(request=ExpectedVersionSerializer, responses=RolloutSerializer,
                   summary="Resume a paused rollout (its wave's clock starts again)")
    def post(self, request, rollout_id):
        return self.transition(request, pausing.rollout_resume)


# --- named strategies ------------------------------------------------------------------


class StrategySerializer(serializers.ModelSerializer):
    tenant = serializers.CharField(source="tenant.slug", allow_null=True, default=None)
    builtin = serializers.BooleanField(source="is_builtin")

    class Meta:
        model = RolloutStrategy
        fields = ["id", "name", "tenant", "builtin", "description", "definition", "created_at"]


class StrategyCreateSerializer(serializers.Serializer):
    tenant = serializers.SlugField(max_length=64)
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                        default="")
    definition = serializers.JSONField()


class StrategyListApi(ListAPIView):
    serializer_class = StrategySerializer

    def get_queryset(self):
        return selectors.strategies_visible_to(self.request.user).distinct()

    @extend_schema(request=StrategyCreateSerializer, responses={201: StrategySerializer},
                   summary="Create a tenant's rollout strategy (its owners)")
    def post(self, request):
        data = StrategyCreateSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = dict(data.validated_data)
        tenant = selectors.tenant_owned(request.user, v.pop("tenant"))
        strategy = strategies.strategy_create(tenant=tenant, actor=request.user, **v)
        return Response(StrategySerializer(strategy).data, status=status.HTTP_201_CREATED)


class StrategyDetailApi(APIView):
    def strategy(self) -> RolloutStrategy:
        strategy = selectors.strategies_visible_to(self.request.user).filter(
            pk=self.kwargs["strategy_id"]).first()
        if strategy is None:
            raise NotFound("Strategy not found.")
        return strategy

    @extend_schema(responses=StrategySerializer)
    def get(self, request, strategy_id):
        return Response(StrategySerializer(self.strategy()).data)

    @extend_schema(responses={204: None}, summary="Delete a tenant's strategy (its owners)")
    def delete(self, request, strategy_id):
        strategy = self.strategy()
        if not strategy.is_builtin:
            selectors.tenant_owned(request.user, strategy.tenant.slug)
        strategies.strategy_delete(strategy=strategy, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class DefaultStrategySerializer(serializers.Serializer):
    strategy = serializers.CharField(max_length=64)


class DefaultStrategyAnswerSerializer(serializers.Serializer):
    environment = serializers.CharField()
    strategy = StrategySerializer(allow_null=True)


class EnvironmentStrategyApi(EnvironmentAPIView):
    """The strategy an environment's rollouts start from when they name none."""

    def answer(self, env: Environment) -> Response:
        strategy = strategies.default_strategy(env)
        return Response({"environment": env.full_name,
                         "strategy": StrategySerializer(strategy).data if strategy else None})

    @extend_schema(responses=DefaultStrategyAnswerSerializer)
    def get(self, request, application, environment):
        return self.answer(self.environment(Role.VIEWER))

    @extend_schema(request=DefaultStrategySerializer, responses=DefaultStrategyAnswerSerializer,
                   summary="Set the environment's default rollout strategy (owners)")
    def put(self, request, application, environment):
        env = self.environment(Role.OWNER)
        data = DefaultStrategySerializer(data=request.data)
        data.is_valid(raise_exception=True)
        strategy = strategies.strategy_named(env, data.validated_data["strategy"])
        strategies.environment_strategy_set(environment=env, strategy=strategy,
                                            actor=request.user)
        return self.answer(env)

    @extend_schema(responses={204: None}, summary="Clear the default rollout strategy")
    def delete(self, request, application, environment):
        strategies.environment_strategy_set(environment=self.environment(Role.OWNER),
                                            strategy=None, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)
