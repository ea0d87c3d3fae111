"""A publish with the direct policy in a governed environment (or during a freeze):
the snapshot is stored and its activation held by the release gate, and the answer
says so. Governed: a release asking to activate it is submitted (by the publisher)
in the transaction that stores it, and the 201 body names it under `held`
(approval_required, what is missing); the dashboard shows it; approving and
activating it uses that release."""

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.audit.models import AuditEvent
from apps.governance import rules, windows
from apps.governance.models import ReleaseRequest
from apps.releases import services as releases
from apps.snapshots.models import Publication
from tests import factories
from tests.api_helpers import assert_error
from tests.governance.conftest import approve

ENV = "/api/v1/environments/shop/prod"
# The publish renders on commit, inline (tasks are eager in tests): a real commit.
eager = pytest.mark.django_db(transaction=True)


def _change(environment, actor, workers: int = 8):
    environment.refresh_from_db()
    config = environment.config.replace("workers: 4", f"workers: {workers}")
    releases.environment_update(environment=environment, actor=actor, config=config)


@eager
def test_a_governed_direct_publish_answers_201_naming_the_release_that_asks(
        environment, first, superuser, deployer, two_approvals):
    _change(environment, superuser)

    response = factories.api_client_for(deployer).post(f"{ENV}/publish", {}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert (body["activates"], body["activated"]) == (True, False)
    release = ReleaseRequest.objects.get()
    assert body["held"]["code"] == "approval_required"
    assert body["held"]["details"]["release"] == release.pk
    assert (body["held"]["details"]["given"], body["held"]["details"]["required"]) == (0, 2)
    assert f"release {release.pk}" in body["release"]["note"]
    assert (release.snapshot.number, release.plan, release.requested_by) == (
        2, rules.activation_plan(), deployer)
    assert AuditEvent.objects.filter(action="release.submit").count() == 1
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk


@eager
def test_once_approved_activating_it_uses_that_release_and_the_hold_is_gone(
        environment, first, superuser, deployer, alice, bob, two_approvals):
    _change(environment, superuser)
    api = factories.api_client_for(deployer)
    body = api.post(f"{ENV}/publish", {}, format="json").json()
    release = ReleaseRequest.objects.get(pk=body["held"]["details"]["release"])
    assert_error(api.post(f"{ENV}/snapshots/2/activate", {}, format="json"), 409,
                 "approval_required")
    approve(release, alice)
    approve(release, bob)

    assert api.post(f"{ENV}/snapshots/2/activate", {}, format="json").status_code == 200
    release.refresh_from_db()
    assert release.state == ReleaseRequest.State.RELEASED
    later = api.get(body["url"]).json()
    assert later["held"] is None and later["snapshot"]["active"] is True


@eager
def test_an_ungoverned_direct_publish_holds_nothing_and_asks_nobody(environment, first,
                                                                    superuser, deployer):
    _change(environment, superuser)
    body = factories.api_client_for(deployer).post(f"{ENV}/publish", {}, format="json").json()
    assert (body["activated"], body["held"]) == (True, None)
    assert not ReleaseRequest.objects.exists()


@pytest.mark.django_db
def test_a_direct_publish_during_a_freeze_is_held_saying_so(environment, first, superuser):
    now = timezone.now()
    windows.window_create(environment=environment, actor=superuser, kind="freeze",
                          name="sale", starts_at=now - timedelta(minutes=1),
                          ends_at=now + timedelta(hours=1))
    _change(environment, superuser)

    held = factories.publication(environment, superuser)

    assert held.activated is False and held.held["code"] == "frozen"
    assert held.held["details"]["window"] == "sale"
    assert not ReleaseRequest.objects.exists()  # nobody approves a freeze away


@pytest.mark.django_db
def test_a_staged_publish_in_a_governed_environment_asks_nothing(second, two_approvals):
    publication = Publication.objects.get(snapshot=second)
    assert publication.held is None and not ReleaseRequest.objects.exists()


@pytest.mark.django_db
def test_the_dashboard_publish_leads_to_the_publication_saying_it_waits_for_approval(
        environment, first, superuser, deployer, two_approvals):
    _change(environment, superuser)
    client = factories.session_client(deployer)
    client.post("/e/shop/prod/publish/")  # queued: the render waits for the commit
    publication = factories.render(Publication.objects.get(snapshot__isnull=True))
    release = ReleaseRequest.objects.get()

    page = client.get(f"/e/shop/prod/publications/{publication.pk}/").content.decode()

    assert "Waiting for approval" in page and f"release {release.pk}" in page
    assert f"#release-{release.pk}" in page


def _degenerate(environment, actor):
    """A publication held for its degenerate render (a file that had content emptied)."""
    from apps.environments.services import environment_file_put
    environment_file_put(environment=environment, kind="template", path="nginx/shop.conf",
                         text="", actor=actor)
    held = factories.publication(environment, actor)
    assert held.needs_confirmation is not None and held.activated is False
    return held


@eager
def test_confirming_a_held_render_in_a_governed_environment_records_it_and_asks(
        environment, first, superuser, deployer, alice, bob, two_approvals):
    held = _degenerate(environment, superuser)
    api = factories.api_client_for(deployer)

    confirmed = api.post(f"/api/v1/publications/{held.pk}/confirm")

    assert confirmed.status_code == 200, confirmed.content
    body = confirmed.json()
    release = ReleaseRequest.objects.get()
    assert (body["held"]["code"], body["held"]["details"]["release"]) == (
        "approval_required", release.pk)
    assert release.requested_by == deployer  # whoever confirmed asks
    held.refresh_from_db()
    assert held.confirmed is True and held.activated is False
    assert AuditEvent.objects.filter(action="publication.confirm").count() == 1
    environment.refresh_from_db()
    assert environment.active_snapshot_id == first.pk

    approve(release, alice)
    approve(release, bob)
    assert api.post(f"{ENV}/snapshots/{held.snapshot.number}/activate", {},
                    format="json").status_code == 200  # confirmed once: no confirm again
    environment.refresh_from_db()
    assert environment.active_snapshot_id == held.snapshot_id


@pytest.mark.django_db
def test_confirming_a_held_render_during_a_freeze_records_it_held_by_the_freeze(
        environment, first, superuser):
    from apps.releases.promotion import publication_confirm
    held = _degenerate(environment, superuser)
    now = timezone.now()
    windows.window_create(environment=environment, actor=superuser, kind="freeze",
                          name="sale", starts_at=now - timedelta(minutes=1),
                          ends_at=now + timedelta(hours=1))

    confirmed = publication_confirm(publication=held, actor=superuser)

    assert confirmed.confirmed is True and confirmed.activated is False
    assert confirmed.held["code"] == "frozen" and not ReleaseRequest.objects.exists()
    assert AuditEvent.objects.filter(action="publication.confirm").count() == 1


@pytest.mark.django_db
def test_a_confirm_another_check_refuses_still_answers_that_refusal(
        environment, first, superuser, monkeypatch):
    """Refusals outside the release gate (a rollout deciding, quarantine) are raised
    as before: nothing is recorded."""
    from apps.core.errors import Conflict
    from apps.releases import promotion
    held = _degenerate(environment, superuser)

    def refusing(**kwargs):
        raise Conflict("A rollout decides what becomes active.", code="rollout_active")
    monkeypatch.setattr(promotion, "snapshot_activate", refusing)

    with pytest.raises(Conflict):
        promotion.publication_confirm(publication=held, actor=superuser)
    held.refresh_from_db()
    assert held.confirmed is False and held.held is None
