"""agent/state.py: state.json written atomically, round-tripped exactly."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

from agent.state import MAX_REMEMBERED_DEPLOYMENTS, State, state_path
from tests.agent.support import temp_files


def full_state() -> State:
    return State(
        active_number=4, active_checksum="sha256:" + "a" * 64, active_label="20250101-004",
        managed_files=["a.conf", "sub/b.conf"], etag='"abc"',
        blocked={"number": 5, "checksum": "sha256:" + "b" * 64},
        processed_deployments={"d-1": {"status": "succeeded"}},
        unsent_report={"deployment_id": None, "snapshot": 4, "checksum": "sha256:x",
                       "status": "succeeded", "message": "applied"},
        in_progress={"number": 5, "checksum": "c", "manifest": {"existed": [], "paths": []}},
    )


def test_load_of_a_missing_file_is_an_empty_state(tmp_path):
    assert State.load(str(tmp_path / "state.json")) == State()


def test_save_then_load_round_trips_every_field(tmp_path):
    path = state_path(str(tmp_path / "state"))
    state = full_state()

    state.save(path)

    assert State.load(path) == state
    assert path == str(tmp_path / "state" / "state.json")


def test_state_file_is_private_to_the_agent(tmp_path):
    path = str(tmp_path / "state.json")

    full_state().save(path)

    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_load_ignores_keys_it_does_not_know(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"active_number": 3, "from_a_newer_agent": [1, 2]}))

    assert State.load(str(path)) == State(active_number=3)


def test_a_save_that_fails_leaves_the_previous_state_file_intact(tmp_path):
    path = str(tmp_path / "state.json")
    full_state().save(path)
    before = Path(path).read_text()
    broken = full_state()
    broken.unsent_report = {"not": object()}  # not JSON-serialisable

    with pytest.raises(TypeError):
        broken.save(path)

    assert Path(path).read_text() == before
    assert temp_files(tmp_path) == []


def test_state_file_is_never_seen_partially_written(tmp_path):
    path = str(tmp_path / "state.json")
    state = full_state()
    state.processed_deployments = {f"d-{i}": {"message": "x" * 200} for i in range(150)}
    state.save(path)
    done = threading.Event()
    parsed = []

    def read_constantly():
        while not done.is_set():
            with open(path) as handle:
                parsed.append(json.load(handle)["active_number"])

    reader = threading.Thread(target=read_constantly)
    reader.start()
    try:
        for number in range(30):
            state.active_number = number
            state.save(path)
    finally:
        done.set()
        reader.join()

    assert parsed  # json.load never raised on a half-written file
    assert State.load(path).active_number == 29
    assert temp_files(tmp_path) == []


def test_processed_deployments_are_capped_keeping_the_newest(tmp_path):
    path = str(tmp_path / "state.json")
    state = State()
    ids = [f"dep-{i:04d}" for i in range(MAX_REMEMBERED_DEPLOYMENTS + 50)]
    for deployment_id in ids:
        state.processed_deployments[deployment_id] = {"deployment_id": deployment_id}

    state.save(path)

    assert list(state.processed_deployments) == ids[-MAX_REMEMBERED_DEPLOYMENTS:]
    assert set(State.load(path).processed_deployments) == set(ids[-MAX_REMEMBERED_DEPLOYMENTS:])


def test_processed_deployments_cap_keeps_the_newest_across_a_restart(tmp_path):
    path = str(tmp_path / "state.json")
    state = State()
    # Deployment ids are UUIDs: their alphabetical order is not their age.
    ids = [f"{((i + 1) * 7919) % 1000:03d}-dep" for i in range(MAX_REMEMBERED_DEPLOYMENTS)]
    for deployment_id in ids:
        state.processed_deployments[deployment_id] = {"deployment_id": deployment_id}
    state.save(path)

    restarted = State.load(path)
    restarted.processed_deployments["zzz-newest"] = {"deployment_id": "zzz-newest"}
    restarted.save(path)

    kept = set(State.load(path).processed_deployments)
    assert kept == set(ids[1:]) | {"zzz-newest"}  # the oldest, ids[0], is the one dropped


def test_is_blocked_matches_number_and_checksum_exactly():
    state = State(blocked={"number": 5, "checksum": "sha256:b"})

    assert state.is_blocked(5, "sha256:b")
    assert not state.is_blocked(5, "sha256:other")
    assert not state.is_blocked(6, "sha256:b")
    assert not State().is_blocked(5, "sha256:b")
