"""The agent protocol (docs/design.md): enroll, desired (ETag polling), bundle, reports,
drift.

GET desired is the hot path: `desired_etag` answers 304 from the cache before any
view machinery or SQL runs; on a miss, or for an agent a recent change made the
cached answer untrustworthy (apps.fleet.polldebt), the view computes the answer
from the database and caches its ETag.
"""

import functools

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.utils.cache import get_conditional_response, patch_vary_headers
from django.views.decorators.http import condition
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import AllowAny, IsAuthenticated
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core import metrics, tokens
from apps.core.compression import accepts_gzip
from apps.core.errors import NotFound
from apps.core.fields import LabelsField, NameField, ShownTextField, WholeNumberField
from apps.environments.models import Environment
from apps.fleet import cache, drift, enrollment, heartbeats, polldebt, rules, selectors
from apps.fleet.authentication import AgentTokenAuthentication, presented_agent_token
from apps.fleet.models import Agent
from apps.releases import services as releases
from apps.snapshots.models import Snapshot


def desired_etag(request) -> str | None:
    """The agent's current ETag from the cache (and its heartbeat), or None on a miss
    or when a change not yet settled may have left the cached ETag stale."""
    parsed = presented_agent_token(request)
    if parsed is None:
        return None
    key, secret = parsed
    state = cache.poll_state(key)
    owed, failure = polldebt.owes(key, None if state is None else state.get("generation"))
    if owed:
        return None
    if state is None or not tokens.secret_matches(secret, state["token_hash"]):
        if failure is not None:  # the database just failed: 503 now, not after a wait
            raise failure
        return None
    heartbeats.heartbeat_record(state["agent_id"], cache.renewal_key(key, state))
    return state["etag"]


class AgentAPIView(APIView):
    authentication_classes = [AgentTokenAuthentication]
    permission_classes = [IsAuthenticated]

    @property
    def agent(self):
        return self.request.auth


class EnrollApi(APIView):
    authentication_classes = []
    permission_classes = [AllowAny]

    class EnrollRequestSerializer(serializers.Serializer):
        enrollment_token = serializers.CharField(max_length=200)
        name = NameField(max_length=64)
        labels = LabelsField(required=False, default=dict)

    class EnrollResponseSerializer(serializers.Serializer):
        agent_id = WholeNumberField()
        token = serializers.CharField()
        environment = serializers.CharField()

    @extend_schema(request=EnrollRequestSerializer, responses={201: EnrollResponseSerializer},
                   summary="Exchange an enrollment token for the agent's own token")
    def post(self, request):
        data = self.EnrollRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        agent, token = enrollment.agent_enroll(**data.validated_data)
        return Response(
            {"agent_id": agent.pk, "token": token, "environment": agent.environment.full_name},
            status=status.HTTP_201_CREATED,
        )


class DesiredSerializer(serializers.Serializer):
    class DesiredSnapshotSerializer(serializers.Serializer):
        number = WholeNumberField()
        label = serializers.CharField()
        checksum = serializers.CharField()
        bundle_url = serializers.CharField()

    snapshot = DesiredSnapshotSerializer(allow_null=True)
    deployment_id = serializers.UUIDField(allow_null=True)
    mode = serializers.ChoiceField(Agent.Mode.choices)
    poll_interval_s = WholeNumberField()
    drift_policy = serializers.ChoiceField(Environment.DriftPolicy.choices)


class DesiredApi(AgentAPIView):
    query_parameters = ("wait",)

    @extend_schema(
        parameters=[OpenApiParameter(
            "wait", int, description="Long-poll: with If-None-Match, hold the answer until "
            "the desired state changes or this many seconds pass (at most the "
            "Bellwether-Long-Poll header's value; more is served as that), then 304")],
        responses={200: DesiredSerializer, 304: OpenApiResponse(
            description="Not modified (If-None-Match matched)")},
        summary="The agent's desired snapshot (send If-None-Match)")
    def get(self, request):
        agent = self.agent
        body, etag = selectors.desired_state_for(agent)
        # The generation read with the agent's row: what the answer reflects at least.
        cache.store_poll_state(token_key=agent.token_key, token_hash=agent.token_hash,
                               agent_id=agent.pk, environment_id=agent.environment_id,
                               etag=etag, generation=agent.generation,
                               body=selectors.desired_body_bytes(body))
        # A change committed since we read may have dropped the entry before we
        # stored it: read again, and drop what we stored if it is already stale.
        if not selectors.poll_state_current(agent.pk, token_key=agent.token_key, etag=etag):
            cache.forget_poll_states([agent.token_key])
        heartbeats.heartbeat_record(agent.pk)  # its state was just written
        # Reached on a cache miss (or outage): the same conditional answer, from the DB.
        not_modified = get_conditional_response(request, etag=etag)
        if not_modified is not None:
            not_modified["ETag"], not_modified["Cache-Control"] = etag, "no-cache"
            return not_modified
        return Response(body, headers={"ETag": etag, "Cache-Control": "no-cache"})


def _wait_problem(request) -> str | None:
    """What is wrong with `?wait=N`: a whole number of seconds, given once (a larger
    one than the server's maximum is served as the maximum)."""
    values = request.GET.getlist("wait")
    if len(values) > 1:
        return "give it once"
    if values and rules.poll_wait_seconds(values[0]) is None:
        return "must be a whole number of seconds in digits 0-9"
    return None


def _long_poll_aware(view):
    """`?wait=N` checked before anything else (400 naming `wait`), and every desired
    answer saying how long a poll may be held. The wait itself is the edge's
    (agentapi.edge): a poll Django answers is answered at once."""

    @functools.wraps(view)  # keeps csrf_exempt and the view class
    def advertised(request, *args, **kwargs):
        problem = _wait_problem(request)
        if problem is not None:
            return JsonResponse({"error": {
                "code": "invalid", "message": f"wait: {problem}",
                "details": [{"field": "wait", "message": problem}]}}, status=400)
        response = view(request, *args, **kwargs)
        cap = settings.BELLWETHER_LONG_POLL_MAX_S
        if cap and response.status_code in (200, 304):
            response["Bellwether-Long-Poll"] = str(cap)
        return response

    return advertised


# The 304 is decided by Django's own conditional-request handling (RFC 9110:
# lists, "*", weak comparison for If-None-Match, HEAD) before DRF runs; on the
# production server most are answered before Django (agentapi.edge).
desired_view = _long_poll_aware(condition(etag_func=desired_etag)(DesiredApi.as_view()))


class BundleApi(AgentAPIView):
    @extend_schema(responses={200: OpenApiResponse(description=(
        "{number, label, checksum, files: [{path, content}], fallback_files: [...], "
        "secrets: [{placeholder, reference, files}], secret_file_mode?} (the secrets "
        "manifest: the only placeholders an agent resolves; the mode of the files "
        "receiving them when the environment declares one); ETag is the checksum in "
        "quotes, with +gzip for the gzip representation"))},
        summary="A snapshot's files (immutable); gzip-compressed (stored so) when "
                "Accept-Encoding allows it")
    def get(self, request, number):
        # Only the stored form this client gets is read: the identity or the gzip bytes.
        gzip = accepts_gzip(request.headers.get("Accept-Encoding"))
        column = "bundle_gzip" if gzip else "bundle"
        snapshot = (
            Snapshot.objects.filter(environment_id=self.agent.environment_id, number=number,
                                    state=Snapshot.State.READY)
            .only("checksum", column)
            .first()
        )
        if snapshot is None:
            raise NotFound(f"No snapshot {number} for this agent.")
        body = bytes(getattr(snapshot, column))
        # Each representation has its own strong ETag (RFC 9110 8.8.3).
        etag = f'"{snapshot.checksum}{"+gzip" if gzip else ""}"'
        not_modified = get_conditional_response(request, etag=etag)
        if not_modified is not None:
            not_modified["ETag"] = etag
            patch_vary_headers(not_modified, ["Accept-Encoding"])
            return not_modified
        response = HttpResponse(body, content_type="application/json")
        if gzip:
            response["Content-Encoding"] = "gzip"
        response["ETag"] = etag
        patch_vary_headers(response, ["Accept-Encoding"])
        response["Cache-Control"] = "private, max-age=31536000, immutable"
        return response


class HealthSerializer(serializers.Serializer):
    """The agent's health probe after its reload (docs/agents.md), exactly typed: the
    agent sends JSON booleans, integers and strings, never "true" or "3"."""

    TYPES = {"ok": (bool, "a boolean"), "attempts": (int, "an integer"),
             "output": (str, "a string"), "probe": (str, "a string")}

    ok = serializers.BooleanField()
    attempts = WholeNumberField(min_value=1, max_value=1000)
    output = ShownTextField(max_length=2000, allow_blank=True, trim_whitespace=False)
    probe = serializers.ChoiceField(["command", "url"])

    def to_internal_value(self, data):
        if isinstance(data, dict):
            wrong = {name: [f"Must be {what}."] for name, (kind, what) in self.TYPES.items()
                     if name in data and (not isinstance(data[name], kind)
                                          or (kind is int and isinstance(data[name], bool)))}
            if wrong:
                raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


class ReportApi(AgentAPIView):
    class ReportRequestSerializer(serializers.Serializer):
        deployment_id = serializers.UUIDField(allow_null=True, required=False, default=None)
        snapshot = WholeNumberField(min_value=1)
        checksum = serializers.CharField(max_length=71)
        status = serializers.ChoiceField(["succeeded", "warning", "failed"])
        message = ShownTextField(max_length=4000, allow_blank=True, required=False,
                                 default="", trim_whitespace=False)
        health = HealthSerializer(required=False, allow_null=True, default=None)

    class ReportResponseSerializer(serializers.Serializer):
        deployment_id = serializers.UUIDField()
        state = serializers.CharField()
        duplicate = serializers.BooleanField()

    @extend_schema(request=ReportRequestSerializer, responses={201: ReportResponseSerializer,
                                                       200: ReportResponseSerializer},
                   summary="Report the result of applying a snapshot")
    def post(self, request):
        data = self.ReportRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        deployment, created = releases.report_intake(
            agent=self.agent, deployment_id=v["deployment_id"], number=v["snapshot"],
            checksum=v["checksum"], status=v["status"], message=v["message"],
            health=None if v["health"] is None else dict(v["health"]))
        if created:
            metrics.report_accepted(v["status"])
        return Response(
            {"deployment_id": str(deployment.pk), "state": deployment.state,
             "duplicate": not created},
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class _StrictNameField(NameField):
    """A name that was sent as a string (a number is not a path)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class _StrictBooleanField(serializers.BooleanField):
    """A JSON boolean, never "yes", "true" or 1 (as the health probe's `ok`)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            raise serializers.ValidationError("Must be a boolean.")
        return data


class DriftFileSerializer(serializers.Serializer):
    """One drifted file: never its content, only a short summary of the change."""

    path = _StrictNameField(max_length=drift.MAX_DRIFT_PATH, trim_whitespace=False)
    change = serializers.ChoiceField(drift.DRIFT_CHANGES)
    summary = _StrictNameField(max_length=drift.MAX_SUMMARY, allow_blank=True, required=False,
                               default="", trim_whitespace=False)


class DriftApi(AgentAPIView):
    class DriftRequestSerializer(serializers.Serializer):
        snapshot = WholeNumberField(min_value=1, max_value=2**31 - 1)
        checksum = serializers.CharField(max_length=71)
        files = serializers.ListField(child=DriftFileSerializer(), allow_empty=True,
                                      max_length=drift.MAX_DRIFT_FILES)
        restored = _StrictBooleanField(required=False, default=False)

        def validate_files(self, value):
            repeated = rules.drift_repeated_path(f["path"] for f in value)
            if repeated is not None:  # named as files[i].path
                raise serializers.ValidationError(
                    [{}] * repeated + [{"path": ["Each path at most once."]}])
            return [dict(f) for f in value]

    class DriftResponseSerializer(serializers.Serializer):
        recorded = serializers.BooleanField(help_text="False for an identical repeat.")
        drifted = WholeNumberField(help_text="How many files are drifted now.")

    @extend_schema(request=DriftRequestSerializer, responses={200: DriftResponseSerializer},
                   summary="Report managed files that no longer match the applied snapshot "
                           "(an empty list: no longer drifted)")
    def post(self, request):
        data = self.DriftRequestSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        recorded = drift.agent_drift_record(
            agent=self.agent, number=v["snapshot"], checksum=v["checksum"], files=v["files"],
            restored=v["restored"])
        return Response({"recorded": recorded, "drifted": len(v["files"])})
