"""The pure rules of rollouts (apps.rollouts.rules), without a database."""

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apps.rollouts import rules
from apps.rollouts.rules import (
    BLOCKER_REASONS,
    WaveEvidence,
    assign_waves,
    describe,
    is_canary,
    nothing_to_roll_out,
    plan_waves,
    wave_sizes,
    wave_specs_problem,
)
from cli.progress import wave_label


@pytest.mark.parametrize(("total", "canaries", "waves", "sizes"), [
    (10, 1, [{"percent": 100}], [1, 9]),
    (10, 1, [{"percent": 20}, {"percent": 100}], [1, 2, 7]),
    (10, 2, [{"count": 3}, {"count": 3}], [2, 3, 5]),
    (10, 10, [{"percent": 50}], [10]),
    (3, 1, [{"percent": 1}, {"percent": 1}, {"percent": 1}], [1, 1, 1]),
    (100, 1, [{"percent": 10}], [1, 99]),
])
def test_wave_sizes_take_percent_or_count_and_the_last_spec_takes_the_rest(
        total, canaries, waves, sizes):
    assert wave_sizes(total, canaries, waves) == sizes


@given(total=st.integers(1, 500), data=st.data())
def test_every_target_lands_in_exactly_one_wave(total, data):
    canaries = data.draw(st.integers(1, total))
    waves = data.draw(st.lists(st.one_of(
        st.builds(lambda p: {"percent": p}, st.integers(1, 100)),
        st.builds(lambda c: {"count": c}, st.integers(1, 50))), min_size=1, max_size=6))
    sizes = wave_sizes(total, canaries, waves)
    assert sum(sizes) == total and sizes[0] == canaries and all(s > 0 for s in sizes[1:])
    plan = plan_waves(total=total, canaries=canaries, waves=waves, canary_gate="manual",
                      bake_s=0)
    agents = list(range(total))
    assignment = assign_waves(agents[:canaries], agents[canaries:], plan)
    assert sorted(a for a, _ in assignment) == agents
    assert [sum(1 for _, w in assignment if w == i) for i in range(len(plan))] == sizes


def test_the_plan_gives_canaries_their_gate_and_later_waves_their_specs():
    plan = plan_waves(total=10, canaries=1, waves=[{"percent": 20, "gate": "manual",
                                                    "bake_s": 60}, {"percent": 100}],
                      canary_gate="manual", bake_s=30)
    assert plan == [{"size": 1, "gate": "manual", "bake_s": 30},
                    {"size": 2, "gate": "manual", "bake_s": 60},
                    {"size": 7, "gate": "auto", "bake_s": 0}]


@pytest.mark.parametrize("waves", [[{"percent": 0}], [{"percent": 101}], [{"count": 0}],
                                   [{"gate": "auto"}]])
def test_a_wave_without_a_usable_percent_or_count_is_a_problem(waves):
    assert wave_specs_problem(waves) == "Each wave needs a percent (1-100) or a count (>= 1)."


def test_a_canary_is_named_by_id_or_carries_every_canary_label():
    web = SimpleNamespace(pk=1, labels={"role": "web", "zone": "a"})
    assert is_canary(web, ids={1}, labels=None)
    assert is_canary(web, ids=set(), labels={"role": "web"})
    assert not is_canary(web, ids=set(), labels={"role": "web", "zone": "b"})
    assert not is_canary(web, ids={2}, labels={})


def test_a_wave_is_complete_only_when_everyone_acknowledged():
    assert WaveEvidence(acknowledged=["a"]).complete
    assert not WaveEvidence().complete
    assert not WaveEvidence(acknowledged=["a"], failed=["b"]).complete


def test_a_settled_wave_tolerates_failures_but_nothing_else():
    assert WaveEvidence(acknowledged=["a"], failed=["b"]).settled
    for blocker in ("waiting", "released", "changed"):
        assert not WaveEvidence(acknowledged=["a"], **{blocker: ["b"]}).settled


def test_blockers_name_each_kind_in_order():
    evidence = WaveEvidence(waiting=["w"], failed=["f1", "f2"], released=["r"])
    blockers = evidence.blockers()
    assert blockers == [("released", ["r"]), ("failed", ["f1", "f2"]), ("waiting", ["w"])]
    assert describe(blockers, BLOCKER_REASONS) == (
        "released by an operator: r; reported a failure: f1, f2; "
        "not yet acknowledged (fresh and exact): w")
    assert describe(evidence.blockers(order=("waiting", "failed"))) == "waiting: w; failed: f1, f2"


def test_the_rules_name_the_models_gate():
    from apps.rollouts import rules
    from apps.rollouts.models import Rollout

    assert rules.AUTO == Rollout.Gate.AUTO


# --- nothing_to_roll_out ---------------------------------------------------------------


def _runs(number, checksum="sha256:a"):
    return SimpleNamespace(applied_number=number, applied_checksum=checksum if number else "")


@pytest.mark.parametrize(("targets", "nothing"), [
    ([_runs(5), _runs(5)], True),                      # every target already runs #5
    ([_runs(5)], True),
    ([_runs(5), _runs(4)], False),                     # one would apply it
    ([_runs(5), _runs(None)], False),                  # one never applied anything
    ([_runs(5, "sha256:b")], False),                   # same number, other content
    ([_runs(4, "sha256:a")], False),                   # same content, lower number: applies
    ([], False),                                       # no targets: refused elsewhere
])
def test_nothing_to_roll_out_when_every_target_runs_the_exact_snapshot(targets, nothing):
    assert nothing_to_roll_out(5, "sha256:a", targets) is nothing


def test_one_wave_numbering_everywhere():
    """The panel's list, the audit log, reasons and the CLI name waves alike: the
    canaries are wave 0 (cli/progress.wave_label says the same on its side)."""
    assert [rules.wave_name(i) for i in range(3)] == ["the canaries", "wave 1", "wave 2"]
    assert [rules.wave_name(i, 3) for i in range(3)] == [
        "the canaries", "wave 1 of 2", "wave 2 of 2"]
    assert all(wave_label(i, n) == rules.wave_name(i, n) for n in (None, 1, 3, 9)
               for i in range(9))
