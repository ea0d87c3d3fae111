"""Agents' reports, recorded a batch at a time.

The reports route (agentapi.reports) records the reports a process received
meanwhile as one batch, or one alone. Either way a batch costs the
same few queries however many reports it holds: its agents locked (in primary-key
order, as every writer locks them: apps.core.locks), the pushes it names locked, the
snapshots it names and the earlier pulled reports it may repeat read, then one
INSERT of the new deployments and an UPDATE per distinct set of values the reported
pushes and the agents take (one each when the reports say the same, as after a
publish). Each report is decided alone, in order, by the rules below; one refused is
not written and refuses none of the others (a second report of the same agent in
the batch sees the first's changes, as it would one transaction later).
"""

import json
import logging
import uuid
from collections import defaultdict
from typing import NamedTuple

from django.core.serializers.json import DjangoJSONEncoder
from django.db.models import Q
from django.utils import timezone

from apps.core import locks
from apps.core.errors import (
    ApplicationError,
    Conflict,
    NotAuthenticated,
    NotFound,
    ValidationFailed,
)
from apps.core.events import emit
from apps.fleet import rules
from apps.fleet.models import Agent, Deployment
from apps.fleet.services import forget_polls_on_commit
from apps.snapshots.models import Snapshot, without_content

logger = logging.getLogger(__name__)

PUSH_REPORTED_FIELDS = ["state", "message", "health", "reported_checksum", "reported_at"]
# What deciding a report reads of its agent (who may report, what the report
# changes: apps.fleet.rules.report_changes): not its labels, drift or last health,
# whose JSON a batch of a thousand would decode for nothing.
REPORT_READS = ("environment_id", "name", "token_key", "token_revoked_at", "decommissioned_at",
                "applied_number", "blocked_number", "drift_seen_at")


class Report(NamedTuple):
    agent_id: int
    deployment_id: uuid.UUID | None
    number: int
    checksum: str
    status: str
    message: str = ""
    health: dict | None = None
    # The key of the token it came with (None: not checked): a token rotated since
    # its request was authenticated records nothing.
    token_key: str | None = None


class Recorded(NamedTuple):
    deployment: Deployment
    created: bool  # False: a duplicate, which changed nothing


class _Found:
    """What a batch reads before deciding its reports: the agents (locked), the
    pushes they name (locked), the snapshots they name, the earlier pulled reports
    they may repeat."""

    def __init__(self, reports):
        self.agents = {a.pk: a for a in locks.lock_all(
            Agent.objects.filter(pk__in={r.agent_id for r in reports}).only(*REPORT_READS))}
        named = {r.deployment_id for r in reports if r.deployment_id is not None}
        self.pushes = {d.pk: d for d in locks.lock_all(without_content(  # never another's
            Deployment.objects.select_related("snapshot").filter(
                pk__in=named, agent_id__in=list(self.agents)), "snapshot"))
        } if named else {}
        wanted = {(a.environment_id, r.number) for r in reports
                  if (a := self.agents.get(r.agent_id)) is not None}
        self.snapshots = {(s.environment_id, s.number): s for s in without_content(
            Snapshot.objects.filter(_any_of(wanted), state=Snapshot.State.READY)
            .order_by())} if wanted else {}
        self.pulls = self._earlier_pulls(reports)

    def _earlier_pulls(self, reports) -> dict[tuple, Deployment]:
        """(agent, snapshot, state, message) -> the latest pulled report of it."""
        ids = [s.pk for s in self.snapshots.values()]
        agents = {r.agent_id for r in reports if r.deployment_id is None}
        if not (ids and agents):
            return {}
        earlier = Deployment.objects.filter(
            kind=Deployment.Kind.PULL, agent_id__in=agents, snapshot_id__in=ids,
            state__in={r.status for r in reports}).order_by("reported_at", "created_at")
        return {(d.agent_id, d.snapshot_id, d.state, d.message): d for d in earlier}


def _any_of(pairs) -> Q:
    query = Q(pk__in=[])
    for environment_id, number in sorted(pairs):
        query |= Q(environment_id=environment_id, number=number)
    return query


class _Writes:
    """What a batch writes, once every report is decided: the new deployments in one
    INSERT; the reported pushes and the agents each in one UPDATE per distinct set of
    values (after a publish nearly every report sets the same ones: one UPDATE)."""

    def __init__(self):
        self.created: list[Deployment] = []
        self.pushes: list[Deployment] = []
        self.agents: dict[int, Agent] = {}
        self.agent_changes: dict[int, dict] = defaultdict(dict)

    def save(self) -> None:
        if self.created:
            Deployment.objects.bulk_create(self.created)
        _updated(Deployment, {push.pk: {field: getattr(push, field)
                                        for field in PUSH_REPORTED_FIELDS}
                              for push in self.pushes})
        _updated(Agent, self.agent_changes)
        if self.pushes:  # an announced push done: those agents' poll answers change
            forget_polls_on_commit([self.agents[d.agent_id] for d in self.pushes])


def _updated(model, changes_by_pk: dict) -> None:
    """One UPDATE per distinct set of values among `changes_by_pk` (pk -> changes)."""
    alike = defaultdict(list)
    for pk, changes in changes_by_pk.items():
        if changes:
            key = json.dumps(changes, sort_keys=True, cls=DjangoJSONEncoder)
            alike[key].append(pk)
    for pks in alike.values():
        model.objects.filter(pk__in=pks).update(**changes_by_pk[pks[0]])


def reports_record(reports: list[Report]) -> list[Recorded | ApplicationError]:
    """Record agents' reports (inside the caller's transaction), with their health
    probes' results when they ran one: for each report in order, what it recorded
    (created=False for a duplicate, which changes nothing) or why it was refused."""
    found, writes, now = _Found(reports), _Writes(), timezone.now()
    results: list[Recorded | ApplicationError] = []
    for report in reports:
        try:
            results.append(_decided(report, found, writes, now))
        except ApplicationError as refusal:
            results.append(refusal)
    writes.save()
    _announced(reports, results, found)
    return results


def _reporting_agent(found: _Found, report: Report) -> Agent:
    agent = found.agents.get(report.agent_id)
    if (agent is None or agent.decommissioned_at is not None
            or agent.token_revoked_at is not None
            or report.token_key not in (None, agent.token_key)):
        raise NotAuthenticated("This agent may no longer report.")
    return agent


def _reported_push(found: _Found, agent: Agent, report: Report) -> Deployment | None:
    """The announced push a report names; refused when it is not this agent's or not
    of this snapshot."""
    if report.deployment_id is None:
        return None
    push = found.pushes.get(report.deployment_id)
    if push is None or push.agent_id != agent.pk:
        raise NotFound(f"No deployment {report.deployment_id} for this agent.")
    if (push.snapshot.number, push.snapshot.checksum) != (report.number, report.checksum):
        raise Conflict(f"Deployment {report.deployment_id} is of snapshot "
                       f"#{push.snapshot.number} with another checksum.",
                       code="report_conflict")
    return push


def _reported_snapshot(found: _Found, agent: Agent, report: Report) -> Snapshot:
    snapshot = found.snapshots.get((agent.environment_id, report.number))
    if snapshot is None:
        raise ValidationFailed(f"snapshot: no ready snapshot {report.number} in this "
                               "environment.")
    if report.checksum != snapshot.checksum:
        raise ValidationFailed(f"checksum: does not match snapshot {report.number}.",
                               code="checksum_mismatch")
    return snapshot


def _push_reported(push: Deployment, report: Report, writes: _Writes, now) -> bool:
    """Record the result of an announced push; False for a duplicate."""
    if push.state in Deployment.REPORTED_STATES:
        if (push.state, push.message) == (report.status, report.message):
            return False
        raise Conflict(f"Deployment {push.pk} was already reported "
                       f"{push.state} with another message.", code="report_conflict")
    push.state, push.message, push.health = report.status, report.message, report.health
    push.reported_checksum, push.reported_at = report.checksum, now
    writes.pushes.append(push)
    return True


def _pull_reported(found: _Found, agent: Agent, snapshot: Snapshot, report: Report,
                   writes: _Writes, now) -> Recorded:
    """Record a pulled apply as a deployment of its own. A replay of any earlier
    pulled report (the same snapshot, status and message) is a duplicate: an agent
    re-sends a report it is not sure arrived, possibly after newer ones."""
    key = (agent.pk, snapshot.pk, report.status, report.message)
    if (earlier := found.pulls.get(key)) is not None:
        return Recorded(earlier, False)
    pulled = Deployment(
        agent=agent, snapshot=snapshot, kind=Deployment.Kind.PULL, state=report.status,
        message=report.message, health=report.health, reported_checksum=report.checksum,
        reported_at=now)
    found.pulls[key] = pulled
    writes.created.append(pulled)
    return Recorded(pulled, True)


def _decided(report: Report, found: _Found, writes: _Writes, now) -> Recorded:
    if report.status not in Deployment.REPORTED_STATES:
        raise ValidationFailed("status must be succeeded, warning or failed.")
    agent = _reporting_agent(found, report)
    push = _reported_push(found, agent, report)
    snapshot = _reported_snapshot(found, agent, report)
    if push is not None:
        recorded = Recorded(push, _push_reported(push, report, writes, now))
    else:
        recorded = _pull_reported(found, agent, snapshot, report, writes, now)
    if not recorded.created:
        return recorded
    changes = rules.report_changes(agent, number=report.number, checksum=report.checksum,
                                   status=report.status, message=report.message, now=now,
                                   health=report.health)
    for field, value in changes.items():  # none for a late report: history only
        setattr(agent, field, value)
    writes.agents[agent.pk] = agent
    writes.agent_changes[agent.pk].update(changes)
    logger.info("agent %s reported #%s %s%s", agent.name, report.number,  # quoted: no
                report.status, f": {report.message!r}" if report.message else "")  # forged lines
    return recorded


def _announced(reports, results, found: _Found) -> None:
    """The live events of the recorded reports: per environment, a deployment and an
    agent event naming the one report when it recorded one, else naming none (many)."""
    by_environment = defaultdict(list)
    for report, result in zip(reports, results, strict=True):
        if isinstance(result, Recorded) and result.created:
            agent = found.agents[report.agent_id]
            by_environment[agent.environment_id].append((report, result, agent))
    for environment_id, recorded in by_environment.items():
        if len(recorded) == 1:
            [(report, result, agent)] = recorded
            emit("deployment", environment_id=environment_id, id=str(result.deployment.pk),
                 agent=agent.pk, snapshot=report.number)
            emit("agent", environment_id=environment_id, id=agent.pk)
        else:
            emit("deployment", environment_id=environment_id)
            emit("agent", environment_id=environment_id)
