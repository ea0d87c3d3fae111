"""The publish answer says whether it activated: `activates` is known when the
publication is requested (from the release policy), `activated` once it is stored;
in a staged environment `release.released_by` names what releases the snapshot.
Eager: the render runs as the request commits; async: it is still queued."""

import pytest

from apps.releases.services import environment_update, snapshot_publish, snapshot_rollback
from apps.snapshots.models import Publication
from tests.api.support import ENV
from tests.factories import enrolled_agents, publish, render, start_rollout

pytestmark = pytest.mark.django_db
# The render runs on commit, inline (tasks are eager in tests): a real commit is needed.
eager = pytest.mark.django_db(transaction=True)


def _change(environment, superuser, workers: int):
    environment.refresh_from_db()
    config = environment.config.replace("workers: 4", f"workers: {workers}")
    return environment_update(environment=environment, actor=superuser, config=config)


@pytest.fixture
def staged(environment, superuser, first):
    """shop/prod with #1 active and the staged release policy, its config changed."""
    env = environment_update(environment=environment, actor=superuser,
                             release_policy="staged")
    return _change(env, superuser, workers=8)


@eager
def test_a_direct_publish_answers_that_it_activated(environment, first, superuser, client_for):
    _change(environment, superuser, workers=8)
    response = client_for("deployer").post(f"{ENV}/publish")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["activates"], body["activated"]) == (True, True)
    assert body["release"]["policy"] == "direct"
    assert body["release"]["released_by"] == []
    assert body["snapshot"]["active"] is True
    environment.refresh_from_db()
    assert environment.active_snapshot.number == 2


@eager
def test_a_staged_publish_answers_that_it_stored_and_what_releases_it(staged, first,
                                                                      client_for):
    response = client_for("deployer").post(f"{ENV}/publish")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["activates"], body["activated"]) == (False, False)
    assert body["release"]["policy"] == "staged"
    assert body["release"]["released_by"] == ["rollout", "activation"]
    assert "rollout" in body["release"]["note"]
    assert (body["snapshot"]["number"], body["snapshot"]["active"]) == (2, False)
    staged.refresh_from_db()
    assert staged.active_snapshot_id == first.pk


@pytest.mark.parametrize(("policy", "activates"), [("direct", True), ("staged", False)])
def test_while_rendering_the_answer_says_what_will_happen_and_later_what_did(
        policy, activates, environment, first, superuser, client_for):
    environment_update(environment=environment, actor=superuser, release_policy=policy)
    _change(environment, superuser, workers=8)
    client = client_for("deployer")

    queued = client.post(f"{ENV}/publish")  # the render waits for the commit: async

    assert queued.status_code == 202, queued.content
    body = queued.json()
    assert (body["activates"], body["activated"]) == (activates, None)
    assert body["release"]["released_by"] == ([] if activates else ["rollout", "activation"])
    render(Publication.objects.get(pk=body["id"]))
    later = client.get(body["url"]).json()
    assert (later["state"], later["activates"], later["activated"]) == (
        "ready", activates, activates)
    assert later["snapshot"]["active"] is activates


def test_a_direct_publish_during_a_rollout_activates_nothing_and_says_so(
        environment, first, superuser):
    staged = environment_update(environment=environment, actor=superuser,
                                release_policy="staged")
    second = publish(_change(staged, superuser, workers=8), superuser)
    (web1,) = enrolled_agents(environment, 1)
    start_rollout(environment, second, [web1])
    direct = environment_update(environment=environment, actor=superuser,
                                release_policy="direct")

    publication = render(snapshot_publish(environment=_change(direct, superuser, workers=9),
                                          actor=superuser))

    assert (publication.activates, publication.activated) == (True, False)


def test_a_duplicate_publish_activates_nothing(environment, first, superuser):
    publication = render(snapshot_publish(environment=environment, actor=superuser))

    assert publication.deduplicated
    assert (publication.activates, publication.activated) == (True, False)


def test_an_environment_rollback_activates_even_when_staged(staged, first, superuser):
    publication = render(snapshot_rollback(snapshot=first, actor=superuser))

    assert (publication.activates, publication.activated) == (True, True)
