"""Release rules without a database: what a finished publication becomes, and when
a new snapshot is activated at once."""

import pytest

from apps.releases.rules import RELEASED_BY, publication_activates, release_note
from apps.snapshots.rules import Outcome, publication_outcome

CONTENT = ("sha256:aa", [])


def outcome(**overrides):
    args = {"inputs_audit_id": 10, "newest_inputs_audit_id": 5, "is_valid": True,
            "is_plain_publish": True, "content": CONTENT, "latest_content": ("sha256:bb", [])}
    return publication_outcome(**{**args, **overrides})


def test_new_content_is_a_new_snapshot():
    assert outcome() == Outcome.NEW


def test_a_request_older_than_the_newest_snapshots_is_superseded_whatever_it_holds():
    assert outcome(newest_inputs_audit_id=11) == Outcome.SUPERSEDED
    assert outcome(newest_inputs_audit_id=11, is_valid=False) == Outcome.SUPERSEDED


def test_the_same_content_as_the_latest_ready_snapshot_is_a_duplicate():
    assert outcome(latest_content=CONTENT) == Outcome.DUPLICATE


@pytest.mark.parametrize("latest_fallback", [[{"path": "f", "content": "x"}]])
def test_other_fallback_files_make_new_content(latest_fallback):
    assert outcome(latest_content=("sha256:aa", latest_fallback)) == Outcome.NEW


def test_a_descriptor_or_a_rollback_is_always_a_snapshot_of_its_own():
    assert outcome(latest_content=CONTENT, is_plain_publish=False) == Outcome.NEW


def test_invalid_content_is_an_invalid_snapshot_never_a_duplicate():
    assert outcome(is_valid=False, latest_content=CONTENT) == Outcome.INVALID


def test_the_first_snapshot_has_nothing_to_match_or_supersede():
    assert outcome(newest_inputs_audit_id=None, latest_content=None) == Outcome.NEW


@pytest.mark.parametrize(("result", "is_rollback", "staged", "rollout", "activates"), [
    (Outcome.NEW, False, False, False, True),
    (Outcome.NEW, False, True, False, False),  # staged: an explicit activation releases it
    (Outcome.NEW, True, True, False, True),  # a rollback is that explicit act
    (Outcome.NEW, False, False, True, False),  # a rollout decides what becomes active
    (Outcome.NEW, True, False, True, False),
    (Outcome.DUPLICATE, False, False, False, False),
    (Outcome.INVALID, False, False, False, False),
    (Outcome.SUPERSEDED, False, False, False, False),
    (None, False, False, False, False),  # already finished by another worker
])
def test_a_new_ready_snapshot_activates_unless_the_environment_or_a_rollout_holds_it(
        result, is_rollback, staged, rollout, activates):
    policy = "staged" if staged else "direct"
    assert publication_activates(outcome=result, is_rollback=is_rollback,
                                 release_policy=policy, rollout_active=rollout) is activates


@pytest.mark.parametrize(("kwargs", "released_by"), [
    ({"activates": True, "activated": None, "state": "rendering"}, []),
    ({"activates": False, "activated": None, "state": "rendering"}, RELEASED_BY),
    ({"activates": True, "activated": True, "state": "ready"}, []),
    ({"activates": False, "activated": False, "state": "ready"}, RELEASED_BY),
    ({"activates": True, "activated": False, "state": "ready"}, RELEASED_BY),  # a rollout ran
    ({"activates": False, "activated": False, "state": "invalid"}, []),
    ({"activates": False, "activated": False, "state": "superseded"}, []),
])
def test_the_release_note_names_what_releases_a_stored_snapshot(kwargs, released_by):
    note = release_note(release_policy="staged", snapshot_active=False, **kwargs)

    assert note["released_by"] == released_by
    assert note["note"]


def test_nothing_is_left_to_release_when_the_snapshot_is_already_active():
    note = release_note(release_policy="staged", activates=False, activated=False,
                        state="ready", snapshot_active=True)

    assert note["released_by"] == []
