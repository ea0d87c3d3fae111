"""Rollout services: every transition (create, confirm, advance, complete, roll back,
reconcile, release, delete) and every refusal, against a real database.

In shop/prod snapshot #1 is active (what agents have) and #2 is ready but not
activated (what the rollouts stage), unless a test says otherwise.
"""

from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.test import override_settings
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.core.errors import Conflict, ValidationFailed
from apps.fleet import services as fleet_services
from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.rollouts import reconcile, selectors, services
from apps.rollouts.models import Rollout, RolloutTarget, SnapshotQuarantine
from apps.snapshots.models import Snapshot
from tests import factories
from tests.factories import (
    ack,
    enrolled_agents,
    poll,
    publish_variant,
    staged_environment,
    start_rollout,
)
from tests.rollouts.support import confirm, fresh, pins, release, rollback, target_states, waves_of

pytestmark = pytest.mark.django_db

LIMITS = {"max_targets": 10_000, "max_active": 20, "max_history": 200}
# After the canaries: one agent, then the rest, each behind a manual gate.
MANUAL_WAVES = [{"count": 1, "gate": "manual"}, {"percent": 100, "gate": "manual"}]


def _generations(nodes) -> dict[int, int]:
    return dict(Agent.objects.filter(pk__in=[n.pk for n in nodes])
                .values_list("pk", "generation"))


def _age(rollout, *, activated_s: int, reported_s: int, agents) -> None:
    """Move a wave's activation and its agents' last report back in time."""
    now = timezone.now()
    RolloutTarget.objects.filter(rollout=rollout, agent__in=[a.pk for a in agents]).update(
        activated_at=now - timedelta(seconds=activated_s))
    Agent.objects.filter(pk__in=[a.pk for a in agents]).update(
        last_report_at=now - timedelta(seconds=reported_s))
    Deployment.objects.filter(agent__in=[a.pk for a in agents]).update(
        reported_at=now - timedelta(seconds=reported_s))


def _manual(node, actor):
    node.agent = fleet_services.agent_update(agent=node.agent, actor=actor, mode="manual")
    return node


def publish_third(environment, actor):
    third = publish_variant(environment, actor, workers=16)
    assert third.number == 3
    return third


def _blocked(error: Conflict) -> dict[str, list[str]]:
    """A not_acknowledged refusal's details: [{"reason", "agents"}] as reason -> agents."""
    assert isinstance(error.details, list), error.details
    return {d["reason"]: d["agents"] for d in error.details}


def _refusal(rollout) -> Conflict:
    with pytest.raises(Conflict) as caught:
        confirm(rollout)
    assert caught.value.code == "not_acknowledged"
    assert fresh(rollout).current_wave == 0
    return caught.value


# --- create ----------------------------------------------------------------------------


def test_a_rollout_targets_every_enabled_agent_and_skips_disabled_ones(
        environment, second, fleet, superuser):
    web1, web2, web3 = fleet(3)
    fleet_services.agent_update(agent=web3.agent, actor=superuser, enabled=False)

    rollout = start_rollout(environment, second, [web1])

    assert set(target_states(rollout)) == {"web-1", "web-2"}
    assert pins([web3]) == {"web-3": (None, None)}


def test_creation_freezes_previous_desired_snapshots_and_pins_only_the_canaries_to_the_new_one(
        environment, first, second, fleet):
    web1, web2, web3 = fleet(3)

    rollout = start_rollout(environment, second, [web1])

    assert pins([web1, web2, web3]) == {"web-1": (2, rollout.pk), "web-2": (1, rollout.pk),
                                        "web-3": (1, rollout.pk)}
    targets = RolloutTarget.objects.filter(rollout=rollout)
    assert {t.previous_snapshot_id for t in targets} == {first.pk}
    assert target_states(rollout) == {"web-1": "activated", "web-2": "pending",
                                      "web-3": "pending"}
    assert [web1.desired_number(), web2.desired_number(), web3.desired_number()] == [2, 1, 1]
    assert rollout.previous_snapshot_id == first.pk
    assert (rollout.state, rollout.version, rollout.current_wave) == ("running", 1, 0)
    assert AuditEvent.objects.filter(action="rollout.create", object_id=str(rollout.pk)).exists()


def test_each_target_is_frozen_on_what_it_desired_itself(environment, first, second, fleet,
                                                         superuser):
    web1, web2, manual = fleet(3)
    _manual(manual, superuser)
    releases.snapshot_deploy(snapshot=second, agent_ids=[manual.pk], actor=superuser)
    assert manual.desired_number() == 2
    third = publish_third(environment, superuser)

    rollout = start_rollout(environment, third, [web1])

    assert pins([web1, web2, manual]) == {"web-1": (3, rollout.pk), "web-2": (1, rollout.pk),
                                          "web-3": (2, rollout.pk)}
    previous = dict(RolloutTarget.objects.filter(rollout=rollout)
                    .values_list("agent__name", "previous_snapshot__number"))
    assert previous == {"web-1": 1, "web-2": 1, "web-3": 2}


def test_explicit_targets_with_current_generations_leave_other_agents_alone(
        environment, second, fleet):
    web1, web2, web3 = fleet(3)
    before = _generations([web3])

    rollout = services.rollout_create(
        environment=environment, snapshot=second, actor=None, canary_agents=[web1.pk],
        targets=[{"agent": n.pk, "expected_generation": n.fresh().generation}
                 for n in (web1, web2)])

    assert set(target_states(rollout)) == {"web-1", "web-2"}
    assert pins([web3]) == {"web-3": (None, None)}
    assert _generations([web3]) == before


def test_a_stale_expected_generation_is_a_conflict_listing_only_the_stale_targets(
        environment, second, fleet):
    web1, web2, web3 = fleet(3)
    generations = _generations([web1, web2, web3])
    targets = [{"agent": web1.pk, "expected_generation": generations[web1.pk]},
               {"agent": web2.pk, "expected_generation": generations[web2.pk] + 5},
               {"agent": web3.pk, "expected_generation": generations[web3.pk] - 1}]

    with pytest.raises(Conflict) as caught:
        services.rollout_create(environment=environment, snapshot=second, actor=None,
                                targets=targets, canary_agents=[web1.pk])

    assert caught.value.code == "stale"
    assert sorted(d["name"] for d in caught.value.details) == ["web-2", "web-3"]
    assert {d["agent"]: d["generation"] for d in caught.value.details} == {
        web2.pk: generations[web2.pk], web3.pk: generations[web3.pk]}
    assert not Rollout.objects.exists()
    assert _generations([web1, web2, web3]) == generations
    assert set(pins([web1, web2, web3]).values()) == {(None, None)}


def test_a_target_of_another_environment_is_400_naming_the_field(environment, second, fleet,
                                                                  staging):
    web1, = fleet(1)
    stranger, = enrolled_agents(staging[0], 1, prefix="stage")

    with pytest.raises(ValidationFailed) as caught:
        services.rollout_create(
            environment=environment, snapshot=second, actor=None, canary_agents=[web1.pk],
            targets=[{"agent": web1.pk, "expected_generation": web1.fresh().generation},
                     {"agent": stranger.pk, "expected_generation": 1}])

    assert caught.value.code == "unknown_agents"
    assert caught.value.details[0]["field"] == "targets"
    assert caught.value.details[0]["agents"] == [stranger.pk]
    assert not Rollout.objects.exists()


def test_an_agent_pinned_by_an_operator_is_refused(environment, first, second, fleet,
                                                   superuser):
    web1, web2 = fleet(2)
    releases.agent_pin(agent=web2.agent, snapshot=first, actor=superuser,
                             expected_generation=web2.fresh().generation)
    generations = _generations([web1, web2])

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web1])

    assert caught.value.code == "agent_pinned"
    assert "web-2" in caught.value.message
    assert not Rollout.objects.exists()
    assert _generations([web1, web2]) == generations
    assert pins([web1]) == {"web-1": (None, None)}


def test_canaries_can_be_chosen_by_labels(environment, second, fleet):
    fleet(2, prefix="web")
    canaries = fleet(2, prefix="edge", labels={"tier": "canary", "zone": "a"})
    fleet(1, prefix="other", labels={"tier": "canary", "zone": "b"})

    rollout = services.rollout_create(environment=environment, snapshot=second, actor=None,
                                      canary_labels={"tier": "canary", "zone": "a"})

    assert waves_of(rollout)[0] == sorted(n.agent.name for n in canaries)
    assert {p[0] for name, p in pins(canaries).items()} == {2}


@pytest.mark.parametrize("canaries", [
    {},
    {"canary_agents": []},
    {"canary_labels": {"tier": "nothing-matches"}},
], ids=["none", "empty-list", "labels-matching-nobody"])
def test_the_canary_wave_is_never_empty(environment, second, fleet, canaries):
    fleet(2)

    with pytest.raises(ValidationFailed) as caught:
        services.rollout_create(environment=environment, snapshot=second, actor=None,
                                **canaries)

    assert caught.value.code == "no_canaries"
    assert not Rollout.objects.exists()


def test_a_canary_id_outside_the_targets_is_refused(environment, second, fleet):
    web1, web2, outside = fleet(3)

    with pytest.raises(ValidationFailed) as caught:
        services.rollout_create(
            environment=environment, snapshot=second, actor=None,
            canary_agents=[web1.pk, outside.pk],
            targets=[{"agent": n.pk, "expected_generation": n.fresh().generation}
                     for n in (web1, web2)])

    assert caught.value.code == "canary_not_target"
    assert str(outside.pk) in caught.value.message
    assert not Rollout.objects.exists()


def test_wave_sizes_come_from_counts_and_percentages_and_the_last_wave_takes_the_rest(
        environment, second, fleet):
    nodes = fleet(10)

    rollout = start_rollout(environment, second, nodes[:1], bake_s=30, waves=[
        {"count": 2, "gate": "manual", "bake_s": 5},
        {"percent": 50, "gate": "auto", "bake_s": 10},
        {"percent": 100}])

    assert {w: len(names) for w, names in waves_of(rollout).items()} == {0: 1, 1: 2, 2: 5,
                                                                          3: 2}
    assert [(w["size"], w["gate"], w["bake_s"]) for w in fresh(rollout).waves] == [
        (1, "manual", 30), (2, "manual", 5), (5, "auto", 10), (2, "auto", 0)]


def test_when_every_target_is_a_canary_there_is_one_wave(environment, second, fleet):
    nodes = fleet(2)

    rollout = start_rollout(environment, second, nodes)

    assert [w["size"] for w in fresh(rollout).waves] == [2]


@pytest.mark.parametrize("wave", [{}, {"percent": 0}, {"percent": 101}, {"count": 0}],
                         ids=["neither", "zero-percent", "over-100-percent", "zero-count"])
def test_a_wave_without_a_valid_percent_or_count_is_refused(environment, second, fleet, wave):
    web1, = fleet(1)

    with pytest.raises(ValidationFailed):
        start_rollout(environment, second, [web1], waves=[wave])

    assert not Rollout.objects.exists()


def test_one_active_rollout_per_environment(environment, second, fleet, staging):
    web1, web2 = fleet(2)
    start_rollout(environment, second, [web1])
    stage, = enrolled_agents(staging[0], 1, prefix="stage")

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web2])
    other = start_rollout(staging[0], staging[2], [stage])  # another environment may have its own

    assert caught.value.code == "rollout_active"
    assert Rollout.objects.filter(environment=environment).count() == 1
    assert other.environment_id == staging[0].pk


def test_the_database_allows_one_active_rollout_per_environment(environment, first, second):
    def row(state):
        return Rollout(environment=environment, snapshot=second, waves=[], state=state,
                       wave_started_at=timezone.now())

    row("completed").save()
    row("running").save()

    for state in ("running", "paused"):
        with pytest.raises(IntegrityError), transaction.atomic():
            row(state).save()
    row("rolled_back").save()
    assert Rollout.objects.filter(environment=environment).count() == 3


def test_a_snapshot_of_another_environment_is_refused(environment, second, fleet, staging):
    web1, = fleet(1)

    with pytest.raises(ValidationFailed):
        start_rollout(environment, staging[2], [web1])


def test_a_target_that_applied_a_newer_snapshot_needs_a_rollback(environment, first, second,
                                                                 fleet, superuser):
    web1, web2 = fleet(2)
    third = publish_third(environment, superuser)
    ack(web2, third)

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web1])

    assert caught.value.code == "rollback_required"
    assert "web-2" in caught.value.message


@override_settings(BELLWETHER_ROLLOUT_LIMITS={**LIMITS, "max_targets": 2})
def test_more_targets_than_the_bound_are_refused(environment, second, fleet):
    nodes = fleet(3)

    with pytest.raises(ValidationFailed) as caught:
        start_rollout(environment, second, nodes[:1])

    assert caught.value.code == "too_many_targets"
    assert "at most 2" in caught.value.message
    assert not Rollout.objects.exists()


@override_settings(BELLWETHER_ROLLOUT_LIMITS={**LIMITS, "max_targets": 2})
def test_more_explicit_targets_than_the_bound_are_refused_before_they_are_looked_up(
        environment, second, fleet):
    nodes = fleet(2)
    targets = [{"agent": n.pk, "expected_generation": 1} for n in nodes]
    targets.append({"agent": 10**9, "expected_generation": 1})  # would be 404 otherwise

    with pytest.raises(ValidationFailed) as caught:
        services.rollout_create(environment=environment, snapshot=second, actor=None,
                                canary_agents=[nodes[0].pk], targets=targets)

    assert caught.value.code == "too_many_targets"


@override_settings(BELLWETHER_ROLLOUT_LIMITS={**LIMITS, "max_active": 1})
def test_more_active_rollouts_than_the_bound_are_refused(environment, second, fleet, staging):
    web1, = fleet(1)
    stage, = enrolled_agents(staging[0], 1, prefix="stage")
    start_rollout(staging[0], staging[2], [stage])

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web1])

    assert caught.value.code == "too_many_rollouts"
    assert not Rollout.objects.filter(environment=environment).exists()


_variants = iter(range(20, 10_000))


def _rolled_back(environment, canaries) -> Rollout:
    """A rollout of a new variant started and rolled back at once: finished history
    (the rollback makes a newer snapshot, so each round publishes another)."""
    snapshot = publish_variant(environment, None, workers=next(_variants))
    return rollback(start_rollout(environment, snapshot, canaries))


def _newest(environment) -> Snapshot:
    return publish_variant(environment, None, workers=next(_variants))


@override_settings(BELLWETHER_ROLLOUT_LIMITS={**LIMITS, "max_history": 2})
def test_finished_rollouts_beyond_the_bound_are_pruned_oldest_first(environment, second,
                                                                    fleet):
    web1, web2 = fleet(2)
    done = [_rolled_back(environment, [web1]) for _ in range(3)]

    latest = start_rollout(environment, _newest(environment), [web1])

    kept = set(Rollout.objects.filter(environment=environment).values_list("pk", flat=True))
    assert kept == {done[2].pk, latest.pk}  # the bound counts finished ones: 2 - 1 + new
    pruned = AuditEvent.objects.filter(action="rollout.delete",
                                       summary__startswith="Pruned finished rollout")
    assert set(pruned.values_list("object_id", flat=True)) == {str(done[0].pk),
                                                               str(done[1].pk)}
    assert fresh(latest).state == "running"


@override_settings(BELLWETHER_ROLLOUT_LIMITS={**LIMITS, "max_history": 1})
def test_a_full_history_whose_rollouts_hold_pins_is_refused_until_their_pins_go(
        environment, second, fleet, keep_pins):
    web1, web2 = fleet(2)
    held = _rolled_back(environment, [web1])  # web-2 stays held by it
    web3, = fleet(1, start=3)
    newest = _newest(environment)

    with pytest.raises(Conflict) as caught:
        services.rollout_create(environment=environment, snapshot=newest, actor=None,
                                canary_agents=[web3.pk],
                                targets=[{"agent": web3.pk, "expected_generation":
                                          Agent.objects.get(pk=web3.pk).generation}])
    services.rollout_pins_release(rollout=held, actor=None,
                                  expected_version=fresh(held).version)
    again = start_rollout(environment, newest, [web3])

    assert caught.value.code == "history_full"
    assert "BELLWETHER_ROLLOUT_MAX_HISTORY" in caught.value.message
    assert "release-pins" in caught.value.message
    assert caught.value.details[0]["rollouts_holding_pins"] == [held.pk]
    assert not Rollout.objects.filter(pk=held.pk).exists()
    assert fresh(again).state == "running"


@override_settings(BELLWETHER_ROLLOUT_LIMITS={**LIMITS, "max_active": 1, "max_history": 1})
def test_one_tenants_full_bounds_never_refuse_another_tenant(environment, second, fleet,
                                                             superuser):
    web1, = fleet(1)
    _rolled_back(environment, [web1])
    start_rollout(environment, _newest(environment), [web1])  # one active, history full
    other = factories.tenant(actor=superuser, name="Other team", slug="other-team")
    theirs, _, _ = staged_environment(
        factories.application(other, actor=superuser, name="blog"), "prod", superuser)
    node, = enrolled_agents(theirs, 1, prefix="blog")
    _rolled_back(theirs, [node])

    again = start_rollout(theirs, _newest(theirs), [node])

    assert fresh(again).state == "running"
    assert Rollout.objects.active().filter(environment=environment).count() == 1


# --- confirm ---------------------------------------------------------------------------


@pytest.fixture
def canaried(environment, first, second, fleet):
    """Two canaries (web-1, web-2), then web-3, then web-4 and web-5, manual gates."""
    nodes = fleet(5)
    rollout = start_rollout(environment, second, nodes[:2], waves=MANUAL_WAVES)
    return rollout, nodes


def test_a_stale_expected_version_is_a_conflict(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)

    with pytest.raises(Conflict) as caught:
        services.rollout_confirm(rollout=rollout, expected_version=rollout.version + 1,
                                 actor=None)

    assert caught.value.code == "stale"
    assert fresh(rollout).current_wave == 0


def test_confirm_waits_for_every_agent_of_the_wave(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)

    error = _refusal(rollout)
    ack(nodes[1], second)
    confirmed = confirm(rollout)

    assert _blocked(error)["waiting"] == ["web-2"]
    assert "not yet acknowledged" in error.message and "web-2" in error.message
    assert (confirmed.current_wave, confirmed.version) == (1, 2)


def test_an_acknowledgement_older_than_the_freshness_window_does_not_count(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)
    window = selectors.freshness_window(fresh(rollout))
    assert window == timedelta(seconds=180)  # 3 x 30 s polls, raised to the minimum

    _age(rollout, activated_s=400, reported_s=window.seconds + 20, agents=nodes[:2])
    error = _refusal(rollout)
    _age(rollout, activated_s=400, reported_s=window.seconds - 10, agents=nodes[:2])

    assert _blocked(error)["waiting"] == ["web-1", "web-2"]
    assert confirm(rollout).current_wave == 1


@pytest.mark.parametrize(("poll_s", "window_s"), [(5, 180), (30, 180), (100, 300),
                                                   (1200, 3600), (3600, 3600)])
def test_the_freshness_window_is_three_polls_between_180_seconds_and_an_hour(
        canaried, environment, poll_s, window_s):
    rollout, _ = canaried
    type(environment).objects.filter(pk=environment.pk).update(poll_interval_s=poll_s)

    assert selectors.freshness_window(fresh(rollout)) == timedelta(seconds=window_s)


def test_an_acknowledgement_before_activation_does_not_count(environment, second, fleet):
    web1, web2 = fleet(2)
    ack(web1, second)  # applied #2 before the rollout made it its desired snapshot

    rollout = start_rollout(environment, second, [web1])
    error = _refusal(rollout)

    assert _blocked(error)["waiting"] == ["web-1"]


def test_a_report_with_another_checksum_is_refused_and_does_not_count(canaried, second):
    rollout, nodes = canaried
    ack(nodes[1], second)

    with pytest.raises(ValidationFailed) as caught:
        releases.report_intake(agent=nodes[0].agent, deployment_id=None, number=second.number,
                            checksum="sha256:" + "0" * 64, status="succeeded", message="")
    error = _refusal(rollout)

    assert caught.value.code == "checksum_mismatch"
    assert _blocked(error)["waiting"] == ["web-1"]


def test_an_applied_checksum_other_than_the_snapshots_does_not_count(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)
    Agent.objects.filter(pk=nodes[0].pk).update(applied_checksum="sha256:" + "f" * 64)

    error = _refusal(rollout)

    assert _blocked(error)["waiting"] == ["web-1"]


def test_an_acknowledgement_of_another_snapshot_number_does_not_count(
        canaried, environment, second, superuser):
    rollout, nodes = canaried
    third = publish_third(environment, superuser)
    ack(nodes[0], second)
    ack(nodes[1], third)

    error = _refusal(rollout)

    assert _blocked(error)["waiting"] == ["web-2"]


@pytest.mark.parametrize("status", ["failed", "warning"])
def test_a_failure_blocks_confirmation_with_a_reason(canaried, second, status):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second, status=status, message="validate: nginx -t failed")

    error = _refusal(rollout)

    assert _blocked(error)["failed"] == ["web-2"]
    assert "reported a failure: web-2" in error.message


def test_a_changed_generation_blocks_confirmation_with_a_reason(canaried, second, superuser):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)
    fleet_services.agent_update(agent=nodes[1].agent, actor=superuser, mode="manual")

    error = _refusal(rollout)

    assert _blocked(error)["changed"] == ["web-2"]
    assert "changed since activation: web-2" in error.message


def test_a_released_canary_blocks_confirmation_with_a_reason(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)
    release(nodes[1], rollout)

    error = _refusal(rollout)

    assert _blocked(error)["released"] == ["web-2"]
    assert "released by an operator: web-2" in error.message


def test_a_late_report_of_another_snapshot_does_not_turn_an_old_ack_into_a_fresh_one(
        environment, first, second, fleet):
    web1, web2 = fleet(2)
    ack(web1, second)  # before the rollout: must never count
    rollout = start_rollout(environment, second, [web1])

    ack(web1, first)  # a late (re-sent) report of #1: applied stays #2

    assert web1.fresh().applied_number == 2
    _refusal(rollout)


def test_confirming_switches_the_next_waves_pins_and_only_those(canaried, first, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)
    before = fresh(rollout)

    after = confirm(rollout)

    assert pins(nodes) == {"web-1": (2, rollout.pk), "web-2": (2, rollout.pk),
                           "web-3": (2, rollout.pk), "web-4": (1, rollout.pk),
                           "web-5": (1, rollout.pk)}
    assert target_states(rollout)["web-3"] == "activated"
    assert after.wave_started_at > before.wave_started_at
    assert AuditEvent.objects.filter(action="rollout.advance").count() == 1


def test_confirming_the_last_wave_completes_activates_and_releases_every_pin(
        canaried, environment, second, superuser):
    rollout, nodes = canaried
    fleet_services.agent_update(agent=nodes[4].agent, actor=superuser, mode="manual")
    # a mode change bumps the generation: the last wave is activated after it, so fine
    for wave in ([0, 1], [2], [3, 4]):
        for index in wave:
            ack(nodes[index], second)
        confirm(rollout)

    done = fresh(rollout)
    environment.refresh_from_db()
    assert (done.state, done.finished_at is not None) == ("completed", True)
    assert environment.active_snapshot_id == second.pk
    assert set(pins(nodes).values()) == {(None, None)}
    assert set(target_states(rollout).values()) == {"released"}
    assert [n.desired_number() for n in nodes] == [2] * 5
    assert nodes[4].fresh().target_snapshot_id == second.pk  # manual: stays on #2
    assert AuditEvent.objects.filter(action="rollout.complete").exists()


def test_a_finished_rollout_cannot_be_confirmed(canaried, second):
    rollout, nodes = canaried
    rollback(rollout)

    with pytest.raises(Conflict) as caught:
        confirm(rollout)

    assert caught.value.code == "rollout_finished"


# --- rollback --------------------------------------------------------------------------


def test_rollback_needs_the_current_version(canaried):
    rollout, _ = canaried

    with pytest.raises(Conflict) as caught:
        services.rollout_rollback(rollout=rollout, expected_version=rollout.version + 1,
                                  actor=None)

    assert caught.value.code == "stale"
    assert fresh(rollout).state == "running"


def test_rollback_re_renders_the_previous_content_as_a_new_higher_active_snapshot(
        canaried, environment, first, second, superuser):
    rollout, nodes = canaried
    fleet_services.agent_update(agent=nodes[2].agent, actor=superuser, mode="manual")
    ack(nodes[0], second)
    ack(nodes[1], second)
    confirm(rollout)  # web-3 (manual) activated; web-4, web-5 pending
    release(nodes[0], rollout)  # web-1 released by an operator

    done = rollback(rollout, reason="bad canary")

    replacement = done.rollback_snapshot
    environment.refresh_from_db()
    assert replacement.number == 3 > second.number
    assert replacement.checksum == first.checksum
    assert replacement.rolled_back_from_id == first.pk
    assert environment.active_snapshot_id == replacement.pk
    assert (done.state, done.reason, done.version) == ("rolled_back", "bad canary", 3)
    # No target is stranded: the pending ones are released too and follow #3.
    assert set(pins(nodes).values()) == {(None, None)}
    assert set(target_states(rollout).values()) == {"released"}
    assert [n.desired_number() for n in nodes] == [3, 3, 3, 3, 3]
    assert nodes[2].fresh().target_snapshot_id == replacement.pk
    quarantine = SnapshotQuarantine.objects.get(snapshot=second)
    assert (quarantine.rollout_id, quarantine.reason) == (rollout.pk, "bad canary")
    assert AuditEvent.objects.filter(action="rollout.rollback").exists()


def test_an_environment_keeping_rollout_pins_keeps_the_pending_targets_pins_on_rollback(
        canaried, keep_pins, environment, first, second, superuser):
    rollout, nodes = canaried
    fleet_services.agent_update(agent=nodes[2].agent, actor=superuser, mode="manual")
    ack(nodes[0], second)
    ack(nodes[1], second)
    confirm(rollout)  # web-3 (manual) activated; web-4, web-5 pending
    release(nodes[0], rollout)  # web-1 released by an operator

    done = rollback(rollout, reason="bad canary")

    replacement = done.rollback_snapshot
    environment.refresh_from_db()
    assert replacement.number == 3 > second.number
    assert replacement.checksum == first.checksum
    assert replacement.rolled_back_from_id == first.pk
    assert environment.active_snapshot_id == replacement.pk
    assert (done.state, done.reason, done.version) == ("rolled_back", "bad canary", 3)
    assert pins(nodes) == {"web-1": (None, None), "web-2": (None, None),
                           "web-3": (None, None), "web-4": (1, rollout.pk),
                           "web-5": (1, rollout.pk)}
    assert target_states(rollout) == {"web-1": "released", "web-2": "released",
                                      "web-3": "released", "web-4": "pending",
                                      "web-5": "pending"}
    assert [n.desired_number() for n in nodes] == [3, 3, 3, 1, 1]
    assert nodes[2].fresh().target_snapshot_id == replacement.pk
    quarantine = SnapshotQuarantine.objects.get(snapshot=second)
    assert (quarantine.rollout_id, quarantine.reason) == (rollout.pk, "bad canary")
    # Quarantined by content: the checksum, in this environment.
    assert (quarantine.environment_id, quarantine.checksum) == (environment.pk, second.checksum)
    assert AuditEvent.objects.filter(action="rollout.rollback").exists()


def test_a_rolled_back_snapshot_is_refused_for_a_new_rollout_without_an_override(
        canaried, environment, second):
    rollout, nodes = canaried
    rollback(rollout)  # it released every pin

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, nodes[:1])
    assert caught.value.code == "quarantined"
    # Even with the override it stays refused here: the rollback made a newer
    # snapshot active, and rolling #2 out again would move the environment back.
    with pytest.raises(Conflict) as older:
        start_rollout(environment, second, nodes[:1], override_reason="fixed upstream")
    assert older.value.code == "rollback_required"


def test_a_rolled_back_snapshot_cannot_be_activated_again(canaried, second, superuser):
    rollout, _ = canaried
    rollback(rollout)

    with pytest.raises(Conflict):
        releases.snapshot_activate(snapshot=second, actor=superuser)


def test_a_finished_rollout_cannot_be_rolled_back(canaried):
    rollout, _ = canaried
    rollback(rollout)

    with pytest.raises(Conflict) as caught:
        rollback(rollout)

    assert caught.value.code == "rollout_finished"
    assert Snapshot.objects.count() == 3  # no second replacement


def test_rollback_after_every_activated_target_was_released_still_terminates(
        environment, second, fleet):
    web1, web2 = fleet(2)
    rollout = start_rollout(environment, second, [web1])
    release(web1, rollout)

    done = rollback(rollout)

    assert done.state == "rolled_back"
    assert pins([web1, web2]) == {"web-1": (None, None), "web-2": (None, None)}


# --- reconcile -------------------------------------------------------------------------


@pytest.fixture
def automatic(environment, first, second, fleet):
    """web-1 canary, then web-2, web-3: automatic gates with a 60 s bake."""
    nodes = fleet(3)
    rollout = start_rollout(environment, second, nodes[:1], canary_gate="auto", bake_s=60,
                            waves=[{"count": 1, "gate": "auto", "bake_s": 60}, {"percent": 100}])
    return rollout, nodes


def _bake(rollout, seconds: int) -> None:
    Rollout.objects.filter(pk=rollout.pk).update(
        wave_started_at=timezone.now() - timedelta(seconds=seconds))


def test_an_automatic_gate_advances_only_after_full_acknowledgement_and_bake_time(
        automatic, second):
    rollout, nodes = automatic

    _bake(rollout, 61)
    unacknowledged = reconcile.rollout_reconcile(rollout_id=rollout.pk)
    ack(nodes[0], second)
    _bake(rollout, 30)
    unbaked = reconcile.rollout_reconcile(rollout_id=rollout.pk)
    _bake(rollout, 61)
    baked = reconcile.rollout_reconcile(rollout_id=rollout.pk)

    assert (unacknowledged, unbaked, baked) == ("waiting", "waiting", "advanced")
    assert fresh(rollout).current_wave == 1
    assert pins(nodes)["web-2"] == (2, rollout.pk)


def test_a_manual_gate_is_never_passed_by_reconcile(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "waiting"
    assert fresh(rollout).current_wave == 0


def test_reconcile_is_idempotent(automatic, second):
    rollout, nodes = automatic
    ack(nodes[0], second)
    _bake(rollout, 61)

    first_pass = reconcile.rollout_reconcile(rollout_id=rollout.pk)
    state = fresh(rollout)
    second_pass = reconcile.rollout_reconcile(rollout_id=rollout.pk)

    assert (first_pass, second_pass) == ("advanced", "waiting")
    again = fresh(rollout)
    assert (again.version, again.current_wave, again.wave_started_at) == (
        state.version, state.current_wave, state.wave_started_at)
    assert AuditEvent.objects.filter(action="rollout.advance").count() == 1


def test_reconcile_completes_the_rollout_after_the_last_automatic_wave(automatic, environment,
                                                                      second):
    rollout, nodes = automatic
    for node in nodes:
        ack(node, second)
        _bake(rollout, 61)
        reconcile.rollout_reconcile(rollout_id=rollout.pk)

    environment.refresh_from_db()
    assert fresh(rollout).state == "completed"
    assert environment.active_snapshot_id == second.pk
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "idle"


def test_failures_beyond_the_threshold_roll_back_by_themselves(environment, first, second,
                                                               fleet):
    nodes = fleet(4)
    rollout = start_rollout(environment, second, nodes[:3], failure_threshold=1)
    ack(nodes[1], second, status="warning", message="#2 restored: health probe failed")

    tolerated = reconcile.rollout_reconcile(rollout_id=rollout.pk)
    ack(nodes[0], second, status="failed", message="x" * 400)
    exceeded = reconcile.rollout_reconcile(rollout_id=rollout.pk)

    assert (tolerated, exceeded) == ("waiting", "rolled_back")
    done = fresh(rollout)
    assert done.state == "rolled_back"
    # The first failed agent by name and what it said (bounded), the others counted.
    first, second_name = nodes[0].agent.name, nodes[1].agent.name
    assert done.reason == (f"more than 1 target(s) failed; {first}: {'x' * 299}… "
                           "(and 1 more)")
    assert done.final_summary["failures"] == [
        {"agent": first, "status": "failed", "message": "x" * 400},
        {"agent": second_name, "status": "warning",
         "message": "#2 restored: health probe failed"}]
    assert SnapshotQuarantine.objects.filter(snapshot=second).exists()
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "idle"


def test_a_failure_before_activation_is_not_counted(environment, second, fleet):
    web1, web2 = fleet(2)
    ack(web1, second, status="failed")
    rollout = start_rollout(environment, second, [web1])

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "waiting"
    assert selectors.failures(fresh(rollout)) == 0


def test_a_wave_that_times_out_pauses_with_a_reason(canaried):
    rollout, _ = canaried
    Rollout.objects.filter(pk=rollout.pk).update(
        wave_started_at=timezone.now() - timedelta(seconds=rollout.wave_timeout_s + 1))

    outcome = reconcile.rollout_reconcile(rollout_id=rollout.pk)
    paused = fresh(rollout)

    assert outcome == "paused"
    assert (paused.state, paused.version) == ("paused", rollout.version + 1)
    assert "not acknowledged within 3600s" in paused.reason
    assert "web-1, web-2" in paused.reason
    assert AuditEvent.objects.filter(action="rollout.pause").exists()
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "idle"


def test_a_paused_rollout_can_still_be_confirmed_and_runs_again(canaried, second):
    rollout, nodes = canaried
    Rollout.objects.filter(pk=rollout.pk).update(
        wave_started_at=timezone.now() - timedelta(seconds=rollout.wave_timeout_s + 1))
    reconcile.rollout_reconcile(rollout_id=rollout.pk)
    ack(nodes[0], second)
    ack(nodes[1], second)

    resumed = confirm(rollout)

    assert (resumed.state, resumed.reason, resumed.current_wave) == ("running", "", 1)


def test_a_report_arriving_drives_the_rollout(environment, first, second, fleet,
                                              django_capture_on_commit_callbacks):
    nodes = fleet(3)
    rollout = start_rollout(environment, second, nodes[:1], canary_gate="auto",
                            waves=[{"count": 1}, {"percent": 100}])

    with django_capture_on_commit_callbacks(execute=True):
        ack(nodes[0], second)

    assert fresh(rollout).current_wave == 1
    assert pins(nodes)["web-2"] == (2, rollout.pk)


def test_a_failure_report_arriving_rolls_back_by_itself(environment, first, second, fleet,
                                                        django_capture_on_commit_callbacks):
    nodes = fleet(3)
    rollout = start_rollout(environment, second, nodes[:1], waves=[{"count": 1}, {"percent": 100}])

    with django_capture_on_commit_callbacks(execute=True):
        ack(nodes[0], second, status="failed", message="reload failed")

    environment.refresh_from_db()
    done = fresh(rollout)
    assert done.state == "rolled_back"
    assert environment.active_snapshot_id == done.rollback_snapshot_id
    assert nodes[0].desired_number() == done.rollback_snapshot.number


def test_the_periodic_reconcile_drives_every_running_rollout(automatic, second, staging):
    rollout, nodes = automatic
    stage, = enrolled_agents(staging[0], 1, prefix="stage")
    other = start_rollout(staging[0], staging[2], [stage])
    ack(nodes[0], second)
    _bake(rollout, 61)

    outcomes = reconcile.rollouts_reconcile()

    assert outcomes == {rollout.pk: "advanced", other.pk: "waiting"}


# --- rollout pin release ---------------------------------------------------------------


def test_releasing_with_another_rollouts_id_is_refused(canaried, environment, staging):
    rollout, nodes = canaried
    stage, = enrolled_agents(staging[0], 1, prefix="stage")
    other = start_rollout(staging[0], staging[2], [stage])
    generation = nodes[2].fresh().generation

    with pytest.raises(Conflict) as caught:
        services.rollout_pin_release(agent=nodes[2].agent, rollout=other, actor=None,
                                     expected_generation=generation)

    assert caught.value.code == "not_pinned"
    assert pins([nodes[2]]) == {"web-3": (1, rollout.pk)}


def test_releasing_with_a_stale_generation_is_refused(canaried):
    rollout, nodes = canaried
    generation = nodes[2].fresh().generation

    with pytest.raises(Conflict) as caught:
        services.rollout_pin_release(agent=nodes[2].agent, rollout=rollout, actor=None,
                                     expected_generation=generation - 1)

    assert caught.value.code == "stale"
    assert caught.value.details == [{"agent": nodes[2].pk, "generation": generation}]
    assert nodes[2].fresh().generation == generation


def test_releasing_a_pending_target_lets_it_follow_the_environment_again(canaried):
    rollout, nodes = canaried
    generation = nodes[3].fresh().generation

    released = release(nodes[3], rollout)

    assert (released.pinned_snapshot_id, released.pin_rollout_id) == (None, None)
    assert released.generation == generation + 1
    assert target_states(rollout)["web-4"] == "released"
    assert nodes[3].desired_number() == 1
    assert AuditEvent.objects.filter(action="rollout.release").exists()


def test_a_rollouts_pin_cannot_be_released_or_replaced_as_an_operator_pin(canaried, first,
                                                                         superuser):
    _, nodes = canaried
    generation = nodes[2].fresh().generation

    with pytest.raises(Conflict) as released:
        fleet_services.agent_pin_release(agent=nodes[2].agent, actor=superuser,
                                expected_generation=generation)
    with pytest.raises(Conflict) as pinned:
        releases.agent_pin(agent=nodes[2].agent, snapshot=first, actor=superuser,
                        expected_generation=generation)

    assert (released.value.code, pinned.value.code) == ("rollout_pin", "agent_pinned")


# --- delete ----------------------------------------------------------------------------


def test_an_active_rollout_cannot_be_deleted(canaried):
    rollout, _ = canaried

    with pytest.raises(Conflict) as caught:
        services.rollout_delete(rollout=rollout, actor=None)

    assert caught.value.code == "rollout_active"
    assert Rollout.objects.filter(pk=rollout.pk).exists()


def test_a_rolled_back_rollout_is_deleted_only_once_its_pins_are_released(canaried,
                                                                          keep_pins):
    rollout, nodes = canaried
    rollback(rollout)

    with pytest.raises(Conflict) as caught:
        services.rollout_delete(rollout=rollout, actor=None)
    for node in nodes[2:]:
        release(node, rollout)
    services.rollout_delete(rollout=rollout, actor=None)

    assert caught.value.code == "pins_remain"
    assert "3 agent(s)" in caught.value.message
    assert f"POST /api/v1/rollouts/{rollout.pk}/release-pins" in caught.value.message
    assert not Rollout.objects.filter(pk=rollout.pk).exists()
    assert not RolloutTarget.objects.filter(rollout_id=rollout.pk).exists()
    assert SnapshotQuarantine.objects.get().rollout_id is None  # the quarantine stays
    assert AuditEvent.objects.filter(action="rollout.delete").exists()


def test_a_completed_rollout_can_be_deleted(environment, second, fleet):
    web1, = fleet(1)
    rollout = start_rollout(environment, second, [web1])
    ack(web1, second)
    confirm(rollout)

    services.rollout_delete(rollout=rollout, actor=None)

    assert not Rollout.objects.exists()


# --- desired state and ETag --------------------------------------------------------------


def test_an_agents_poll_answer_changes_exactly_when_its_pin_changes_what_it_desires(
        environment, first, second, fleet, django_capture_on_commit_callbacks):
    nodes = fleet(3)
    etags = [n.etag() for n in nodes]

    with django_capture_on_commit_callbacks(execute=True):
        rollout = start_rollout(environment, second, nodes[:1], waves=MANUAL_WAVES)
    after_create = [poll(n.client, etag).status_code for n, etag in zip(nodes, etags,
                                                                          strict=True)]
    assert after_create == [200, 304, 304]  # only the canary's desired snapshot moved
    assert nodes[0].polled_number() == 2
    etags = [n.etag() for n in nodes]

    ack(nodes[0], second)
    with django_capture_on_commit_callbacks(execute=True):
        confirm(rollout)
    after_confirm = [poll(n.client, etag).status_code for n, etag in zip(nodes, etags,
                                                                           strict=True)]
    assert after_confirm == [304, 200, 304]
    etags = [n.etag() for n in nodes]

    ack(nodes[1], second)
    with django_capture_on_commit_callbacks(execute=True):
        confirm(rollout)
    after_last_wave = [poll(n.client, etag).status_code for n, etag in zip(nodes, etags,
                                                                             strict=True)]
    assert after_last_wave == [304, 304, 200]
    etags = [n.etag() for n in nodes]

    ack(nodes[2], second)
    with django_capture_on_commit_callbacks(execute=True):
        confirm(rollout)
    after_complete = [poll(n.client, etag).status_code for n, etag in zip(nodes, etags,
                                                                            strict=True)]
    assert fresh(rollout).state == "completed"
    assert after_complete == [304, 304, 304]  # pins released, yet #2 is still desired
    assert [n.polled_number() for n in nodes] == [2, 2, 2]


def test_a_rollback_changes_the_poll_answer_of_every_target(
        environment, first, second, fleet, django_capture_on_commit_callbacks):
    nodes = fleet(2)
    with django_capture_on_commit_callbacks(execute=True):
        rollout = start_rollout(environment, second, nodes[:1], waves=MANUAL_WAVES)
    etags = [n.etag() for n in nodes]

    with django_capture_on_commit_callbacks(execute=True):
        done = rollback(rollout)

    # The pending web-2 is released as well: it follows the new active snapshot.
    assert [poll(n.client, e).status_code for n, e in zip(nodes, etags, strict=True)] == [
        200, 200]
    body = poll(nodes[0].client).json()["snapshot"]
    assert (body["number"], body["checksum"]) == (done.rollback_snapshot.number,
                                                  first.checksum)


# --- what else a running rollout holds -------------------------------------------------


def test_no_snapshot_is_activated_while_a_rollout_is_active(canaried, environment, first,
                                                            superuser):
    third = publish_third(environment, superuser)

    with pytest.raises(Conflict) as caught:
        releases.snapshot_activate(snapshot=third, actor=superuser)

    assert caught.value.code == "rollout_active"
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk


def test_publishing_during_a_rollout_does_not_activate_even_without_explicit_activation(
        canaried, environment, first, superuser):
    environment = environment_update(environment=environment, actor=superuser,
                                     release_policy="direct")

    third = publish_third(environment, superuser)

    environment.refresh_from_db()
    assert third.is_ready
    assert environment.active_snapshot_id == first.pk


def test_a_rollout_never_moves_the_environment_back(environment, first, second, fleet,
                                                    superuser):
    web1, = fleet(1)
    third = publish_third(environment, superuser)
    releases.snapshot_activate(snapshot=third, actor=superuser)

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web1])

    assert caught.value.code == "rollback_required"
    assert "older than the active #3" in caught.value.message
    assert not Rollout.objects.exists()


def test_a_rolled_back_snapshot_is_not_pushed_or_pinned_again(canaried, second, superuser):
    rollout, nodes = canaried
    rollback(rollout)
    node = nodes[0]  # released by the rollback: no pin holds it
    fleet_services.agent_update(agent=node.agent, actor=superuser, mode="manual")

    with pytest.raises(Conflict) as pushed:
        releases.snapshot_deploy(snapshot=second, agent_ids=[node.pk], actor=superuser)
    with pytest.raises(Conflict) as pinned:
        releases.agent_pin(agent=node.agent, snapshot=second, actor=superuser,
                                 expected_generation=node.fresh().generation)
    with pytest.raises(Conflict) as activated:
        releases.snapshot_activate(snapshot=second, actor=superuser)

    assert (pushed.value.code, pinned.value.code, activated.value.code) == (
        "quarantined", "quarantined", "quarantined")


def test_an_empty_target_list_is_refused(environment, second, fleet):
    web1, = fleet(1)

    with pytest.raises(ValidationFailed):
        services.rollout_create(environment=environment, snapshot=second, actor=None,
                                canary_agents=[web1.pk], targets=[])

    assert not Rollout.objects.exists()


def test_a_paused_rollout_still_rolls_back_when_failures_exceed_the_threshold(canaried,
                                                                             second):
    rollout, nodes = canaried
    Rollout.objects.filter(pk=rollout.pk).update(
        wave_started_at=timezone.now() - timedelta(seconds=rollout.wave_timeout_s + 1))
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "paused"
    ack(nodes[0], second, status="failed")

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "rolled_back"
    assert fresh(rollout).state == "rolled_back"


def test_a_failure_reported_during_a_paused_rollout_rolls_it_back_at_once(
        canaried, second, django_capture_on_commit_callbacks):
    rollout, nodes = canaried
    Rollout.objects.filter(pk=rollout.pk).update(
        wave_started_at=timezone.now() - timedelta(seconds=rollout.wave_timeout_s + 1))
    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "paused"

    with django_capture_on_commit_callbacks(execute=True):
        ack(nodes[0], second, status="failed", message="reload failed")

    assert fresh(rollout).state == "rolled_back"


def test_failures_within_the_threshold_do_not_block_an_automatic_gate(environment, second,
                                                                     fleet):
    nodes = fleet(3)
    rollout = start_rollout(environment, second, nodes[:2], canary_gate="auto", failure_threshold=1)
    ack(nodes[0], second)
    ack(nodes[1], second, status="failed")

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "advanced"
    assert pins(nodes)["web-3"] == (2, rollout.pk)


def test_a_manual_gate_needs_every_agent_even_when_failures_are_tolerated(
        environment, second, fleet):
    nodes = fleet(3)
    rollout = start_rollout(environment, second, nodes[:2], failure_threshold=1)
    ack(nodes[0], second)
    ack(nodes[1], second, status="failed")

    assert reconcile.rollout_reconcile(rollout_id=rollout.pk) == "waiting"
    assert _blocked(_refusal(rollout))["failed"] == ["web-2"]


def test_an_agent_that_keeps_polling_keeps_its_acknowledgement_fresh(canaried, second):
    rollout, nodes = canaried
    ack(nodes[0], second)
    ack(nodes[1], second)
    window = selectors.freshness_window(fresh(rollout))
    _age(rollout, activated_s=600, reported_s=window.seconds + 60, agents=nodes[:2])
    assert _blocked(_refusal(rollout))["waiting"] == ["web-1", "web-2"]

    for node in nodes[:2]:
        assert poll(node.client).status_code == 200  # a heartbeat, with #2 applied

    assert confirm(rollout).current_wave == 1


# --- an environment with nothing active yet --------------------------------------------


@pytest.fixture
def nothing_active(environment, superuser, fleet):
    """shop/prod with #1 published but never activated: agents desire nothing."""
    env = environment_update(environment=environment, release_policy="staged", actor=superuser)
    snapshot = publish_variant(env, superuser, workers=8)
    env.refresh_from_db()
    assert env.active_snapshot_id is None
    return env, snapshot, fleet(3)


def test_targets_that_desired_nothing_are_held_at_nothing(nothing_active):
    env, snapshot, nodes = nothing_active

    rollout = start_rollout(env, snapshot, nodes[:1])

    assert pins(nodes) == {"web-1": (1, rollout.pk), "web-2": (None, rollout.pk),
                           "web-3": (None, rollout.pk)}
    assert [n.desired_number() for n in nodes] == [1, None, None]
    assert nodes[1].polled_number() is None


def test_rolling_back_from_nothing_releases_every_target_to_nothing(nothing_active):
    env, snapshot, nodes = nothing_active
    rollout = start_rollout(env, snapshot, nodes[:1])

    done = rollback(rollout)

    env.refresh_from_db()
    assert (done.state, done.rollback_snapshot_id, env.active_snapshot_id) == (
        "rolled_back", None, None)
    assert set(pins(nodes).values()) == {(None, None)}
    assert [n.desired_number() for n in nodes] == [None, None, None]


def test_an_agent_a_rollout_holds_at_nothing_is_refused_by_another_rollout(
        nothing_active, superuser):
    env, snapshot, nodes = nothing_active
    environment_update(environment=env, keep_rollout_pins=True, actor=superuser)
    first_rollout = start_rollout(env, snapshot, nodes[:1])
    rollback(first_rollout)  # web-2 and web-3 stay held (at nothing) by it
    fixed = publish_variant(env, superuser, workers=9)

    with pytest.raises(Conflict) as caught:
        start_rollout(env, fixed, nodes[:1])

    assert caught.value.code == "agent_pinned"
    assert (f"web-2 is held by rollout {first_rollout.pk}; release that rollout's pins "
            f"(POST /api/v1/rollouts/{first_rollout.pk}/release-pins) or roll it back"
            in caught.value.message)
    assert pins(nodes[1:]) == {"web-2": (None, first_rollout.pk),
                               "web-3": (None, first_rollout.pk)}


def test_a_push_to_an_agent_a_rollout_holds_at_nothing_is_refused(nothing_active,
                                                                  superuser):
    env, snapshot, nodes = nothing_active
    start_rollout(env, snapshot, nodes[:1])
    fleet_services.agent_update(agent=nodes[1].agent, actor=superuser, mode="manual")

    with pytest.raises(Conflict) as caught:
        releases.snapshot_deploy(snapshot=snapshot, agent_ids=[nodes[1].pk],
                                       actor=superuser)

    assert caught.value.code == "agent_pinned"


# --- nothing to roll out ---------------------------------------------------------------


def test_a_rollout_of_what_every_target_already_runs_is_refused(environment, second, fleet):
    web1, web2 = fleet(2)
    done = start_rollout(environment, second, [web1, web2])
    ack(web1, second)
    ack(web2, second)
    confirm(done)  # completed: #2 active, both run it

    with pytest.raises(Conflict) as caught:
        start_rollout(environment, second, [web1])
    web3, = fleet(1, start=3)  # a target that does not run it yet: something to do
    again = start_rollout(environment, second, [web3])

    assert caught.value.code == "nothing_to_roll_out"
    assert "Every target already runs #2" in caught.value.message
    assert fresh(again).state == "running"


def test_a_completed_rollout_keeps_its_counts_after_its_pins_are_released(environment,
                                                                          second, fleet):
    web1, = fleet(1)
    done = start_rollout(environment, second, [web1])
    ack(web1, second)

    finished = confirm(done)

    assert finished.state == "completed"
    assert finished.final_summary["waves"] == [
        {"index": 0, "targets": 1, "activated": 1, "acknowledged": 1, "failed": 0}]
    assert finished.final_summary["final_evidence"]["acknowledged"] == ["web-1"]
    assert not Agent.objects.filter(pin_rollout=done).exists()
