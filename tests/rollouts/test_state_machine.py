"""The rollout state machine, explored by Hypothesis against the real services and
database (no mocks).

The machine keeps its own model — every agent's pin and reports, each rollout's
waves, targets and version, the active snapshot — predicts the outcome of every
step from it, and checks the services and the database against it:
- at most one active rollout per environment;
- every agent's desired snapshot (and poll answer) is its pin, else its manual
  target, else the environment's active snapshot;
- snapshot numbers only increase, and the active one never goes back;
- a rollout is created unless refused for the model's own reason, among them
  nothing_to_roll_out when every agent already runs exactly the snapshot;
- confirm succeeds exactly when every agent of the current wave reported
  success for the exact snapshot after its activation, freshly.

Agents report as real agents do: never a number below what they applied, and
never again a snapshot they failed. Each example runs inside a savepoint rolled
back at its end; shop/prod (#1 active, explicit activation) is made once.
"""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from apps.core.errors import ApplicationError
from apps.environments.models import Environment
from apps.fleet import services as fleet_services
from apps.fleet.models import Agent, Deployment
from apps.fleet.selectors import agents_with_desired, desired_state_for
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.rollouts import reconcile, services
from apps.rollouts.models import ACTIVE_STATES, Rollout, RolloutTarget
from apps.snapshots.models import Snapshot
from tests.factories import ack, enrolled_agents, publish, publish_variant

pytestmark = pytest.mark.django_db

AGED_S = 200  # older than the freshness window (180 s for 30 s polls)
STALLED_S = 4000  # longer than the default wave timeout (3600 s)
FAILURES = ("failed", "warning")
CANARIES = st.sets(st.integers(0, 4), min_size=1, max_size=3)
GATES = st.sampled_from(["manual", "auto"])
PLANS = st.sampled_from([
    [{"percent": 100, "gate": "auto"}],
    [{"count": 1, "gate": "manual"}, {"percent": 100, "gate": "auto"}],
    [{"percent": 50, "gate": "auto"}, {"percent": 100, "gate": "manual"}],
])
THRESHOLDS = st.integers(0, 1)
PICK = st.integers(0, 20)


def _expect(call, code=None):
    """Run `call`; with `code`, it must be refused with that code."""
    if code is None:
        return call()
    with pytest.raises(ApplicationError) as caught:
        call()
    assert caught.value.code == code, (caught.value.code, code, caught.value.message)
    return None


def make_machine(environment, actor):
    class RolloutMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self._savepoint = transaction.atomic()
            self._savepoint.__enter__()
            self.step = 0
            self.variant = 100
            active = Environment.objects.get(pk=environment.pk).active_snapshot
            self.active = active.pk
            self.snapshots = {active.pk: (active.number, active.checksum)}
            self.numbers = [active.number]
            self.active_number = active.number
            self.quarantined: set[str] = set()  # checksums: quarantine follows content
            self.rollouts: dict[int, dict] = {}
            self.current: int | None = None
            self.stalled = False
            self.ids: list[int] = []

        def teardown(self):
            transaction.set_rollback(True)
            self._savepoint.__exit__(None, None, None)

        # --- the model ---------------------------------------------------------------

        def _next(self) -> int:
            self.step += 1
            return self.step

        def number(self, snapshot_id: int) -> int:
            return self.snapshots[snapshot_id][0]

        def desired(self, agent_id: int) -> int:
            pin = self.pin[agent_id]
            if pin is not None:
                return pin[0]
            return self.target[agent_id] if agent_id in self.manual else self.active

        def applied_number(self, agent_id: int) -> int:
            applied = self.applied[agent_id]
            return 0 if applied is None else self.number(applied)

        def runs(self, agent_id: int, snapshot_id: int) -> bool:
            """Whether the agent last applied exactly this snapshot: its number and
            checksum (a rollback's replacement has the content, not the number)."""
            applied = self.applied[agent_id]
            return applied is not None and self.snapshots[applied] == self.snapshots[snapshot_id]

        def reports_since(self, agent_id: int, snapshot_id: int, since: int) -> list:
            """This agent's reports of exactly this snapshot after step `since`, except
            those moved back in time (older than any activation)."""
            return [(step, status) for step, reported, status in self.reports[agent_id]
                    if reported == snapshot_id and step > since
                    and step > self.aged_until[agent_id]]

        def evidence(self, agent_id: int, rollout: dict) -> str:
            target = rollout["targets"][agent_id]
            if target["state"] != "activated":
                return target["state"]  # pending or released
            reports = self.reports_since(agent_id, rollout["snapshot"], target["activated"])
            succeeded = [step for step, status in reports if status == "succeeded"]
            failed = [step for step, status in reports if status in FAILURES]
            if failed and (not succeeded or max(failed) > max(succeeded)):
                return "failed"
            if succeeded and self.runs(agent_id, rollout["snapshot"]):
                return "acknowledged"
            return "waiting"

        def wave(self, rollout: dict) -> list[str]:
            return [self.evidence(a, rollout) for a, t in rollout["targets"].items()
                    if t["wave"] == rollout["wave"]]

        def failures(self, rollout: dict) -> int:
            return sum(1 for a, t in rollout["targets"].items() if t["state"] == "activated"
                       and any(status in FAILURES for _, status in self.reports_since(
                           a, rollout["snapshot"], t["activated"])))

        def advance(self, rollout_id: int) -> None:
            rollout = self.rollouts[rollout_id]
            rollout["version"] += 1
            self.stalled = False
            if rollout["wave"] + 1 < len(rollout["gates"]):
                rollout["wave"] += 1
                rollout["state"] = "running"
                for agent_id, target in rollout["targets"].items():
                    if target["wave"] == rollout["wave"] and target["state"] == "pending":
                        target.update(state="activated", activated=self.step)
                        self.pin[agent_id] = (rollout["snapshot"], rollout_id)
                return
            self.active = rollout["snapshot"]
            for agent_id, pin in self.pin.items():
                if pin is not None and pin[1] == rollout_id:
                    if agent_id in self.manual:
                        self.target[agent_id] = rollout["snapshot"]
                    self.pin[agent_id] = None
            for target in rollout["targets"].values():
                target["state"] = "released"
            rollout["state"] = "completed"
            self.current = None

        def rolled_back(self, rollout_id: int) -> None:
            rollout = self.rollouts[rollout_id]
            replacement = Rollout.objects.select_related("rollback_snapshot").get(
                pk=rollout_id).rollback_snapshot
            assert replacement.number > max(self.numbers)
            assert replacement.checksum == self.snapshots[rollout["previous"]][1]
            assert replacement.rolled_back_from_id == rollout["previous"]
            self.remember(replacement)
            self.active = replacement.pk
            # Every pin the rollout still holds is released (the environment does
            # not keep rollout pins): activated manual agents follow the
            # replacement, pending ones keep their target.
            for agent_id, target in rollout["targets"].items():
                if target["state"] in ("activated", "pending"):
                    if self.pin[agent_id] is not None and self.pin[agent_id][1] == rollout_id:
                        self.pin[agent_id] = None
                        if agent_id in self.manual and target["state"] == "activated":
                            self.target[agent_id] = replacement.pk
                    target["state"] = "released"
            self.quarantined.add(self.snapshots[rollout["snapshot"]][1])
            rollout["state"] = "rolled_back"
            rollout["version"] += 1
            self.current = None

        def remember(self, snapshot: Snapshot) -> None:
            self.snapshots[snapshot.pk] = (snapshot.number, snapshot.checksum)
            self.numbers.append(snapshot.number)

        def pick_rollout(self, pick: int) -> int:
            """Mostly the active rollout; now and then any other one."""
            if self.current is not None and pick % 4:
                return self.current
            return sorted(self.rollouts)[pick % len(self.rollouts)]

        def rollout_object(self, rollout_id: int) -> Rollout:
            return Rollout.objects.select_related("snapshot", "environment").get(pk=rollout_id)

        def report_now(self, agent_id: int, snapshot_id: int, status: str) -> None:
            step = self._next()
            ack(Agent.objects.get(pk=agent_id), Snapshot.objects.get(pk=snapshot_id),
                status=status)
            if status == "succeeded":
                self.applied[agent_id] = snapshot_id
            else:
                self.failed[agent_id].add(snapshot_id)
            self.reports[agent_id].append((step, snapshot_id, status))

        def may_report(self, agent_id: int, snapshot_id: int) -> bool:
            return (self.number(snapshot_id) >= self.applied_number(agent_id)
                    and snapshot_id not in self.failed[agent_id])

        # --- rules -------------------------------------------------------------------

        @initialize(count=st.integers(3, 5), with_manual=st.booleans(), canaries=CANARIES,
                    canary_gate=GATES, plan=PLANS, threshold=THRESHOLDS)
        def enroll_and_start(self, count, with_manual, canaries, canary_gate, plan, threshold):
            """Agents on #1, a new snapshot, and a first rollout of it (so that every
            example starts with something to confirm, report on or roll back)."""
            nodes = enrolled_agents(environment, count)
            self.ids = [n.pk for n in nodes]
            self.manual, self.target = set(), {}
            if with_manual:
                agent = fleet_services.agent_update(agent=nodes[-1].agent, actor=actor,
                                                    mode="manual")
                self.manual.add(agent.pk)
                self.target[agent.pk] = self.active
            self.pin = dict.fromkeys(self.ids)
            self.applied = dict.fromkeys(self.ids)  # the snapshot each applied last
            self.reports = {a: [] for a in self.ids}
            self.failed = {a: set() for a in self.ids}
            self.aged_until = dict.fromkeys(self.ids, -1)
            self.publish_new_snapshot()
            self.create(canaries, canary_gate, plan, threshold, pick=-1)  # the new one
            assert self.current is not None

        @rule()
        def publish_new_snapshot(self):
            self._next()
            self.variant += 1
            snapshot = publish_variant(Environment.objects.get(pk=environment.pk), actor,
                                       workers=self.variant)
            assert snapshot.is_ready and snapshot.number > max(self.numbers)
            self.remember(snapshot)

        @rule(pick=PICK)
        def activate(self, pick):
            self._next()
            snapshot_id = sorted(self.snapshots)[pick % len(self.snapshots)]
            # The refusal snapshot_activate checks first.
            refusal = None
            if self.snapshots[snapshot_id][1] in self.quarantined:
                refusal = "quarantined"
            elif self.current is not None:
                refusal = "rollout_active"
            elif self.number(snapshot_id) < self.number(self.active):
                refusal = "rollback_required"
            _expect(lambda: releases.snapshot_activate(
                snapshot=Snapshot.objects.get(pk=snapshot_id), actor=actor), refusal)
            if refusal is None:
                self.active = snapshot_id

        @rule(canaries=CANARIES, canary_gate=GATES, plan=PLANS, threshold=THRESHOLDS,
              pick=PICK)
        def create(self, canaries, canary_gate, plan, threshold, pick):
            self._next()
            snapshot_id = sorted(self.snapshots)[pick % len(self.snapshots)]
            number = self.number(snapshot_id)
            canary_ids = sorted({self.ids[i % len(self.ids)] for i in canaries})
            # The refusal rollout_create checks first: older than the active snapshot
            # before any agent is looked at, then held agents, an agent that applied a
            # newer one, and last every target (all agents) already running exactly
            # this snapshot: none would apply it and report, so it could never finish.
            refusal = None
            if self.snapshots[snapshot_id][1] in self.quarantined:
                refusal = "quarantined"
            elif self.current is not None:
                refusal = "rollout_active"
            elif number < self.number(self.active):
                refusal = "rollback_required"
            elif any(pin is not None for pin in self.pin.values()):
                refusal = "agent_pinned"
            elif any(self.applied_number(a) > number for a in self.ids):
                refusal = "rollback_required"
            elif all(self.runs(a, snapshot_id) for a in self.ids):
                refusal = "nothing_to_roll_out"
            previous = {a: self.desired(a) for a in self.ids}
            rollout = _expect(lambda: services.rollout_create(
                environment=environment, snapshot=Snapshot.objects.get(pk=snapshot_id),
                actor=actor, canary_agents=canary_ids, canary_gate=canary_gate, waves=plan,
                failure_threshold=threshold), refusal)
            if rollout is None:
                return
            targets = {}
            for agent_id, wave, previous_id in RolloutTarget.objects.filter(
                    rollout=rollout).values_list("agent_id", "wave", "previous_snapshot_id"):
                assert previous_id == previous[agent_id]  # frozen: what it desired
                canary = agent_id in canary_ids
                assert (wave == 0) == canary
                targets[agent_id] = {"wave": wave,
                                     "state": "activated" if canary else "pending",
                                     "activated": self.step if canary else None}
                self.pin[agent_id] = (snapshot_id if canary else previous_id, rollout.pk)
            assert set(targets) == set(self.ids)
            self.rollouts[rollout.pk] = {
                "snapshot": snapshot_id, "previous": self.active, "targets": targets,
                "gates": [w["gate"] for w in rollout.waves], "wave": 0, "version": 1,
                "state": "running", "threshold": threshold}
            self.current = rollout.pk
            self.stalled = False

        @rule(agent=st.integers(0, 4), pick=PICK,
              status=st.sampled_from(["succeeded", "succeeded", "failed", "warning"]))
        def report(self, agent, pick, status):
            agent_id = self.ids[agent % len(self.ids)]
            candidates = sorted(s for s in self.snapshots if self.may_report(agent_id, s))
            if not candidates:
                return
            desired = self.desired(agent_id)
            snapshot_id = desired if (pick < 15 and desired in candidates) else (
                candidates[pick % len(candidates)])
            self.report_now(agent_id, snapshot_id, status)

        @precondition(lambda self: self.current is not None)
        @rule(failing=st.sampled_from([None, None, 0, 1]),
              then=st.sampled_from(["confirm", "reconcile", None]))
        def current_wave_reports(self, failing, then):
            """Every agent of the current wave applies what it desires and reports it
            (one of them, maybe, a failure) — how a fleet moves a wave on — and then,
            maybe, an operator confirms or the reconcile runs."""
            rollout_id = self.current
            rollout = self.rollouts[rollout_id]
            wave = sorted(a for a, t in rollout["targets"].items()
                          if t["wave"] == rollout["wave"])
            for index, agent_id in enumerate(wave):
                desired = self.desired(agent_id)
                if self.may_report(agent_id, desired):
                    failed = failing is not None and failing % len(wave) == index
                    self.report_now(agent_id, desired, "failed" if failed else "succeeded")
            if then == "confirm":
                self.confirm_now(rollout_id, stale=False)
            elif then == "reconcile":
                self.reconcile_now(rollout_id)

        @rule(agent=st.integers(0, 4))
        def age_reports(self, agent):
            """Move the agent's reports back beyond the freshness window."""
            step = self._next()
            agent_id = self.ids[agent % len(self.ids)]
            aged = timezone.now() - timedelta(seconds=AGED_S)
            Deployment.objects.filter(agent_id=agent_id).update(reported_at=aged)
            Agent.objects.filter(pk=agent_id, last_report_at__isnull=False).update(
                last_report_at=aged)
            self.aged_until[agent_id] = step

        @precondition(lambda self: self.rollouts)
        @rule(pick=PICK, stale=st.integers(0, 4).map(lambda n: n == 0))
        def confirm(self, pick, stale):
            self.confirm_now(self.pick_rollout(pick), stale)

        def confirm_now(self, rollout_id: int, stale: bool) -> None:
            self._next()
            rollout = self.rollouts[rollout_id]
            refusal = None
            if stale:
                refusal = "stale"
            elif rollout["state"] not in ACTIVE_STATES:
                refusal = "rollout_finished"
            elif set(self.wave(rollout)) != {"acknowledged"}:
                refusal = "not_acknowledged"
            result = _expect(lambda: services.rollout_confirm(
                rollout=self.rollout_object(rollout_id), actor=actor,
                expected_version=rollout["version"] + (7 if stale else 0)), refusal)
            if result is not None:
                self.advance(rollout_id)

        @precondition(lambda self: self.rollouts)
        @rule(pick=PICK)
        def roll_back(self, pick):
            self._next()
            rollout_id = self.pick_rollout(pick)
            rollout = self.rollouts[rollout_id]
            finished = rollout["state"] not in ACTIVE_STATES
            result = _expect(lambda: services.rollout_rollback(
                rollout=self.rollout_object(rollout_id), actor=actor,
                expected_version=rollout["version"]), "rollout_finished" if finished else None)
            if result is not None:
                self.rolled_back(rollout_id)

        @precondition(lambda self: any(p is not None for p in self.pin.values()))
        @rule(pick=PICK)
        def release(self, pick):
            self._next()
            pinned = sorted(a for a, p in self.pin.items() if p is not None)
            agent_id = pinned[pick % len(pinned)]
            rollout_id = self.pin[agent_id][1]
            agent = Agent.objects.get(pk=agent_id)
            services.rollout_pin_release(agent=agent, rollout=self.rollout_object(rollout_id),
                                         expected_generation=agent.generation, actor=actor)
            self.pin[agent_id] = None
            self.rollouts[rollout_id]["targets"][agent_id]["state"] = "released"

        @precondition(lambda self: self.rollouts)
        @rule(pick=PICK, stall=st.integers(0, 3).map(lambda n: n == 0))
        def reconcile(self, pick, stall):
            """The reconcile runs (after, maybe, the current wave outlived its timeout)."""
            if stall and self.current is not None:
                Rollout.objects.filter(pk=self.current).update(
                    wave_started_at=timezone.now() - timedelta(seconds=STALLED_S))
                self.stalled = True
            self.reconcile_now(self.pick_rollout(pick))

        def reconcile_now(self, rollout_id: int) -> None:
            self._next()
            rollout = self.rollouts[rollout_id]
            wave = self.wave(rollout)
            settled = "acknowledged" in wave and set(wave) <= {"acknowledged", "failed"}
            if rollout["state"] not in ACTIVE_STATES:
                expected = "idle"
            elif self.failures(rollout) > rollout["threshold"]:
                expected = "rolled_back"
            elif rollout["state"] == "paused":
                expected = "idle"
            elif settled and rollout["gates"][rollout["wave"]] == "auto":
                expected = "advanced"
            elif self.stalled:
                expected = "paused"
            else:
                expected = "waiting"
            outcome = reconcile.rollout_reconcile(rollout_id=rollout_id)
            assert outcome == expected, (outcome, expected)
            if outcome == "advanced":
                self.advance(rollout_id)
            elif outcome == "rolled_back":
                self.rolled_back(rollout_id)
            elif outcome == "paused":
                rollout["state"], rollout["version"] = "paused", rollout["version"] + 1

        @precondition(lambda self: any(r["state"] not in ACTIVE_STATES
                                       for r in self.rollouts.values()))
        @rule(pick=PICK)
        def delete(self, pick):
            self._next()
            finished = sorted(r for r, v in self.rollouts.items()
                              if v["state"] not in ACTIVE_STATES)
            rollout_id = finished[pick % len(finished)]
            pinned = any(p is not None and p[1] == rollout_id for p in self.pin.values())
            _expect(lambda: services.rollout_delete(rollout=self.rollout_object(rollout_id),
                                                    actor=actor),
                    "pins_remain" if pinned else None)
            if not pinned:
                del self.rollouts[rollout_id]

        # --- invariants --------------------------------------------------------------

        @invariant()
        def at_most_one_active_rollout(self):
            active = list(Rollout.objects.filter(environment=environment,
                                                 state__in=ACTIVE_STATES)
                          .values_list("pk", flat=True))
            assert len(active) <= 1
            assert active == ([self.current] if self.current is not None else [])

        @invariant()
        def desired_is_pin_then_manual_target_then_active(self):
            for agent in agents_with_desired(Agent.objects.filter(pk__in=self.ids)):
                pin = self.pin[agent.pk]
                assert (agent.pinned_snapshot_id, agent.pin_rollout_id) == (
                    pin if pin is not None else (None, None)), agent.name
                if agent.pk in self.manual:
                    assert agent.target_snapshot_id == self.target[agent.pk]
                body, _ = desired_state_for(agent)
                assert body["snapshot"]["number"] == self.number(self.desired(agent.pk)), (
                    agent.name)

        @invariant()
        def snapshot_numbers_only_increase(self):
            env = Environment.objects.select_related("active_snapshot").get(
                pk=environment.pk)
            numbers = list(Snapshot.objects.filter(environment=env).order_by("pk")
                           .values_list("number", flat=True))
            assert numbers == sorted(set(numbers)) == self.numbers
            assert env.snapshot_counter == max(numbers)
            assert env.active_snapshot_id == self.active
            assert env.active_snapshot.number >= self.active_number
            self.active_number = env.active_snapshot.number

        @invariant()
        def rollouts_are_where_the_model_says(self):
            for rollout_id, model in self.rollouts.items():
                row = Rollout.objects.get(pk=rollout_id)
                assert (row.state, row.version, row.current_wave) == (
                    model["state"], model["version"], model["wave"])
                states = dict(RolloutTarget.objects.filter(rollout_id=rollout_id)
                              .values_list("agent_id", "state"))
                assert states == {a: t["state"] for a, t in model["targets"].items()}

    return RolloutMachine


def _staged_with_first(environment, actor) -> None:
    """shop/prod with #1 active and explicit activation from now on."""
    first = publish(environment, actor)
    environment_update(environment=environment, release_policy="staged", actor=actor)
    assert Environment.objects.get(pk=environment.pk).active_snapshot_id == first.pk


def _invariants_hold(machine) -> None:
    machine.at_most_one_active_rollout()
    machine.desired_is_pin_then_manual_target_then_active()
    machine.snapshot_numbers_only_increase()
    machine.rollouts_are_where_the_model_says()


def test_the_model_refuses_a_rollout_of_what_every_agent_already_runs(environment, superuser):
    """Hypothesis's finding of 2026-12-03, replayed step by step: #2 rolled out to
    completion, then #2 again with other canaries. Every agent runs #2, so the
    service refuses it (409 nothing_to_roll_out) and the model must predict that."""
    _staged_with_first(environment, superuser)
    machine = make_machine(environment, superuser)()
    try:
        machine.enroll_and_start(count=3, with_manual=True, canaries={0}, canary_gate="manual",
                                 plan=[{"percent": 100, "gate": "auto"}], threshold=0)
        machine.current_wave_reports(failing=None, then="confirm")  # the canary
        machine.current_wave_reports(failing=None, then="reconcile")  # the rest: completed
        _invariants_hold(machine)
        second = sorted(machine.snapshots)[1]
        assert machine.current is None and machine.active == second
        assert all(machine.runs(agent_id, second) for agent_id in machine.ids)

        machine.create(canaries={1, 2}, canary_gate="manual", plan=[{"percent": 100,
                       "gate": "auto"}], threshold=0, pick=1)  # _expect: refused as predicted

        assert machine.current is None and len(machine.rollouts) == 1
        _invariants_hold(machine)
    finally:
        machine.teardown()


@pytest.mark.slow  # many steps per example
def test_rollout_state_machine_keeps_its_invariants(environment, superuser):
    _staged_with_first(environment, superuser)

    run_state_machine_as_test(make_machine(environment, superuser), settings=settings(
        stateful_step_count=12, suppress_health_check=[HealthCheck.too_slow]))
