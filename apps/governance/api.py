"""Governance API: an environment's approval rule and freeze status, releases asking
for approval (submit, change, approve, reject, skip, withdraw, schedule), freezes and
allow windows, an owner's emergency override, and scheduled releases."""

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response

from apps.core.errors import NotFound
from apps.environments.models import Environment
from apps.environments.selectors import require_role
from apps.environments.views import EnvironmentAPIView
from apps.governance import schedules, selectors, services, windows
from apps.governance import serializers as s
from apps.governance.models import (
    Approval,
    ReleaseRequest,
    ReleaseWindow,
    ScheduledRelease,
)
from apps.snapshots.selectors import snapshot_get
from apps.tenancy.models import Role


def _valid(serializer_class, request, **options):
    data = serializer_class(data=request.data, **options)
    data.is_valid(raise_exception=True)
    return data


def _release_body(release: ReleaseRequest) -> dict:
    return {**s.ReleaseRequestSerializer(release).data, **selectors.release_status(release)}


def _in_visible(model, pk: int, user, required: Role):
    """A row of `model` in an environment `user` may see (404) with `required` (403)."""
    row = (model.objects.select_related("environment__application__tenant")
           .filter(pk=pk, environment__in=Environment.objects.visible_to(user)).first())
    if row is None:
        raise NotFound(f"{model._meta.verbose_name.capitalize()} {pk} not found.")
    require_role(user=user, environment=row.environment, required=required)
    return row


class GovernanceApi(EnvironmentAPIView):
    @extend_schema(responses=s.GovernanceStatusSerializer,
                   summary="The approval rule and freeze status")
    def get(self, request, application, environment):
        env = self.environment()
        override = selectors.override_in_force(env.pk, timezone.now())
        return Response({"environment": env.full_name, "rule": selectors.rule_of(env.pk),
                         "governed": selectors.is_governed(env.pk),
                         "frozen": selectors.freeze_in_force(env),
                         "override": override and {"reason": override.reason,
                                                   "ends_at": override.ends_at}})

    @extend_schema(request=s.RuleSerializer, responses=s.RuleOutSerializer,
                   summary="Set the approval rule (owners)")
    def put(self, request, application, environment):
        env = self.environment(Role.OWNER)
        v = _valid(s.RuleSerializer, request).validated_data
        services.approval_rule_set(environment=env, actor=request.user, **v)
        return Response({"environment": env.full_name, "rule": selectors.rule_of(env.pk)})


class ReleaseListApi(EnvironmentAPIView):
    @extend_schema(responses=s.ReleaseListSerializer, summary="Releases asking approval")
    def get(self, request, application, environment):
        env = self.environment()
        releases = (ReleaseRequest.objects.filter(environment=env)
                    .select_related("snapshot", "environment__application", "requested_by",
                                    "skipped_by")[:100])
        return Response({"results": s.ReleaseRequestSerializer(releases, many=True).data})

    @extend_schema(request=s.ReleaseSubmitSerializer, responses={201: s.ReleaseDetailSerializer},
                   summary="Ask for approval of a snapshot and its plan")
    def post(self, request, application, environment):
        env = self.environment(Role.DEPLOYER)
        data = _valid(s.ReleaseSubmitSerializer, request)
        plan = s.PlanSerializer(data=request.data["plan"])
        plan.is_valid(raise_exception=True)
        release = services.release_submit(
            environment=env, actor=request.user, plan=plan.plan(),
            note=data.validated_data["note"],
            snapshot=snapshot_get(environment=env, number=data.validated_data["snapshot"]))
        return Response(_release_body(release), status=status.HTTP_201_CREATED)


class _ReleaseApi(EnvironmentAPIView):
    def release_for(self, required: Role) -> ReleaseRequest:
        return _in_visible(ReleaseRequest, self.kwargs["release_id"], self.request.user,
                           required)


class ReleaseDetailApi(_ReleaseApi):
    @extend_schema(responses=s.ReleaseDetailSerializer)
    def get(self, request, release_id):
        return Response(_release_body(self.release_for(Role.VIEWER)))

    @extend_schema(request=s.ReleaseUpdateSerializer, responses=s.ReleaseDetailSerializer,
                   summary="Change the snapshot or plan: every decision given is cancelled")
    def patch(self, request, release_id):
        release = self.release_for(Role.DEPLOYER)
        v = _valid(s.ReleaseUpdateSerializer, request).validated_data
        plan = None
        if "plan" in v:
            plan_data = s.PlanSerializer(data=request.data["plan"])
            plan_data.is_valid(raise_exception=True)
            plan = plan_data.plan()
        snapshot = (snapshot_get(environment=release.environment, number=v["snapshot"])
                    if "snapshot" in v else None)
        updated = services.release_update(release=release, actor=request.user, plan=plan,
                                          snapshot=snapshot,
                                          expected_version=v["expected_version"])
        return Response(_release_body(updated))


class _DecisionApi(_ReleaseApi):
    decision = Approval.Decision.APPROVE

    @extend_schema(request=s.DecisionSerializer, responses=s.ReleaseDetailSerializer,
                   summary="Decide on a release, naming the checksum and plan digest reviewed")
    def post(self, request, release_id):
        release = self.release_for(Role.VIEWER)
        v = _valid(s.DecisionSerializer, request).validated_data
        decided = services.release_decide(release=release, actor=request.user,
                                          decision=self.decision, **v)
        return Response(_release_body(decided))


class ReleaseApproveApi(_DecisionApi):
    decision = Approval.Decision.APPROVE


class ReleaseRejectApi(_DecisionApi):
    decision = Approval.Decision.REJECT


class ReleaseSkipApi(_ReleaseApi):
    @extend_schema(request=s.SkipReasonSerializer, responses=s.ReleaseDetailSerializer,
                   summary="Skip the approvals (platform admins, where the rule allows)")
    def post(self, request, release_id):
        release = self.release_for(Role.VIEWER)
        v = _valid(s.SkipReasonSerializer, request).validated_data
        return Response(_release_body(services.release_skip(release=release,
                                                            actor=request.user, **v)))


class ReleaseWithdrawApi(_ReleaseApi):
    @extend_schema(request=None, responses=s.ReleaseDetailSerializer, summary="Withdraw a release")
    def post(self, request, release_id):
        release = self.release_for(Role.DEPLOYER)
        return Response(_release_body(services.release_withdraw(release=release,
                                                                actor=request.user)))


class ReleaseScheduleApi(_ReleaseApi):
    @extend_schema(request=s.ScheduleSerializer, responses={201: s.ScheduledReleaseSerializer},
                   summary="Start the release at a time (compare-and-set when it runs)")
    def post(self, request, release_id):
        release = self.release_for(Role.DEPLOYER)
        v = _valid(s.ScheduleSerializer, request).validated_data
        schedule = schedules.schedule_create(release=release, actor=request.user,
                                             run_at=v["run_at"],
                                             expected_version=v["expected_version"],
                                             confirmed=v["confirm"])
        return Response(s.ScheduledReleaseSerializer(schedule).data,
                        status=status.HTTP_201_CREATED)


class ScheduleListApi(EnvironmentAPIView):
    @extend_schema(responses=s.ScheduleListSerializer)
    def get(self, request, application, environment):
        rows = (ScheduledRelease.objects.filter(environment=self.environment())
                .select_related("expected_active_snapshot").order_by("-run_at")[:100])
        return Response({"results": s.ScheduledReleaseSerializer(rows, many=True).data})


class ScheduleCancelApi(EnvironmentAPIView):
    @extend_schema(request=None, responses=s.ScheduledReleaseSerializer,
                   summary="Cancel a scheduled release")
    def post(self, request, schedule_id):
        schedule = _in_visible(ScheduledRelease, schedule_id, request.user, Role.DEPLOYER)
        cancelled = schedules.schedule_cancel(schedule=schedule, actor=request.user)
        return Response(s.ScheduledReleaseSerializer(cancelled).data)


class WindowListApi(EnvironmentAPIView):
    @extend_schema(responses=s.WindowListSerializer, summary="Freezes and allow windows")
    def get(self, request, application, environment):
        env = self.environment()
        rows = ReleaseWindow.objects.filter(environment=env)
        return Response({"results": s.WindowSerializer(rows, many=True).data,
                         "frozen": selectors.freeze_in_force(env)})

    @extend_schema(request=s.WindowInputSerializer, responses={201: s.WindowSerializer},
                   summary="Add a freeze or an allow window (owners)")
    def post(self, request, application, environment):
        env = self.environment(Role.OWNER)
        v = dict(_valid(s.WindowInputSerializer, request).validated_data)
        window = windows.window_create(environment=env, actor=request.user,
                                       timezone_name=v.pop("timezone"), **v)
        return Response(s.WindowSerializer(window).data, status=status.HTTP_201_CREATED)


class WindowDetailApi(EnvironmentAPIView):
    @extend_schema(responses={204: None}, summary="Delete a freeze or an allow window")
    def delete(self, request, window_id):
        window = _in_visible(ReleaseWindow, window_id, request.user, Role.OWNER)
        windows.window_delete(window=window, actor=request.user)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FreezeOverrideApi(EnvironmentAPIView):
    @extend_schema(request=s.OverrideSerializer, responses={201: s.OverrideOutSerializer},
                   summary="An owner's emergency override of the freezes, with a reason")
    def post(self, request, application, environment):
        env = self.environment(Role.OWNER)
        v = _valid(s.OverrideSerializer, request).validated_data
        override = windows.freeze_override(environment=env, actor=request.user, **v)
        return Response({"id": override.pk, "reason": override.reason,
                         "starts_at": override.starts_at, "ends_at": override.ends_at},
                        status=status.HTTP_201_CREATED)
