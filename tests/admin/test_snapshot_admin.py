"""Snapshots and audit events in the admin are records: viewable, never edited."""

import html

import pytest

from apps.audit.models import AuditEvent
from apps.releases.services import environment_update
from apps.snapshots.models import Snapshot
from tests.admin.support import AUDIT_EVENTS, SNAPSHOTS, change_url, listed
from tests.factories import publish


def page_text(response) -> str:
    return html.unescape(response.content.decode())


def test_snapshot_change_page_shows_the_diff_against_the_previous_snapshot(
        login, tenant_owner, snapshots):
    first, second = snapshots

    response = login(tenant_owner).get(change_url(SNAPSHOTS, second.pk))

    assert response.status_code == 200
    text = page_text(response)
    assert "Against #1:" in text
    assert '-{"log_level": "info", "workers": 4}' in text
    assert '+{"log_level": "info", "workers": 8}' in text
    assert "shop/app.json <small>(modified)</small>" in text
    assert "nginx/shop.conf <small>" not in text, "unchanged files are not diffed"


def test_first_snapshot_change_page_shows_every_file_as_added(login, tenant_owner, snapshots):
    response = login(tenant_owner).get(change_url(SNAPSHOTS, snapshots[0].pk))

    assert response.status_code == 200
    text = page_text(response)
    assert "First snapshot of shop/prod." in text
    assert "nginx/shop.conf <small>(added)</small>" in text
    assert "+    server_name shop.example.com;" in text


def test_invalid_snapshot_change_page_lists_its_problems(
        login, tenant_owner, environment, superuser):
    environment_update(environment=environment, actor=superuser,
                       config="listen: 80\nserver_name: shop.example.com\nupstreams: []\n")
    snapshot = publish(environment, superuser)
    assert snapshot.state == "invalid"
    problem = snapshot.report["errors"][0]
    assert (problem["file"], problem["line"]) == ("shop/app.json", 1), problem

    response = login(tenant_owner).get(change_url(SNAPSHOTS, snapshot.pk))

    assert response.status_code == 200
    text = page_text(response)
    assert f"<li>shop/app.json {problem['line']}: {problem['message']}</li>" in text


def test_post_to_a_snapshot_change_page_is_refused_and_changes_nothing(
        login, superuser, snapshots):
    snapshot = snapshots[1]

    response = login(superuser).post(change_url(SNAPSHOTS, snapshot.pk), {
        "label": "tampered", "state": "invalid", "number": "99"})

    assert response.status_code == 403
    stored = Snapshot.objects.get(pk=snapshot.pk)
    assert (stored.label, stored.state, stored.number) == (snapshot.label, "ready", 2)


@pytest.mark.parametrize("url", [
    SNAPSHOTS + "add/",
    "{snapshot}delete/",
])
def test_snapshots_cannot_be_added_or_deleted(url, login, superuser, snapshots):
    client = login(superuser)
    url = url.format(snapshot=f"{SNAPSHOTS}{snapshots[0].pk}/")

    assert client.get(url).status_code == 403
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert Snapshot.objects.count() == 2


def test_snapshot_changelist_offers_no_add_link_and_no_delete_action(
        login, superuser, snapshots):
    response = login(superuser).get(SNAPSHOTS)

    assert len(listed(response)) == 2
    content = response.content.decode()
    assert "delete_selected" not in content
    assert f'href="{SNAPSHOTS}add/"' not in content
    assert response.context["has_add_permission"] is False


def test_bulk_delete_action_on_snapshots_is_refused(login, superuser, snapshots):
    response = login(superuser).post(SNAPSHOTS, {
        "action": "delete_selected", "_selected_action": [str(s.pk) for s in snapshots],
        "post": "yes"})

    assert response.status_code == 200
    assert Snapshot.objects.count() == 2


def test_audit_event_change_page_is_read_only(login, superuser, environment):
    event = AuditEvent.objects.filter(environment=environment).first()
    client = login(superuser)

    assert client.get(change_url(AUDIT_EVENTS, event.pk)).status_code == 200
    assert client.post(change_url(AUDIT_EVENTS, event.pk),
                       {"action": "forged", "summary": "forged"}).status_code == 403
    assert client.get(f"{AUDIT_EVENTS}{event.pk}/delete/").status_code == 403
    assert client.get(f"{AUDIT_EVENTS}add/").status_code == 403
    event.refresh_from_db()
    assert event.action != "forged"
