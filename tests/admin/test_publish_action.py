"""The "publish" action on the environment changelist."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.snapshots.models import Publication, Snapshot
from tests.admin.support import ENVIRONMENTS, messages_of


def publish_action(client, *environments):
    return client.post(ENVIRONMENTS, {
        "action": "publish",
        "_selected_action": [str(e.pk) for e in environments],
    }, follow=True)


def test_publish_action_creates_a_ready_snapshot(
        login, tenant_owner, environment, django_capture_on_commit_callbacks):
    client = login(tenant_owner)

    with django_capture_on_commit_callbacks() as callbacks:
        response = publish_action(client, environment)
    assert response.status_code == 200
    assert not Snapshot.objects.filter(environment=environment).exists(), (
        "the render is enqueued on commit, not before")
    for callback in callbacks:
        callback()

    snapshot = Snapshot.objects.get(environment=environment)
    assert (snapshot.number, snapshot.state, snapshot.author) == (1, "ready", tenant_owner)
    assert [f["path"] for f in snapshot.files] == ["nginx/shop.conf", "shop/app.json"]
    assert AuditEvent.objects.filter(action="snapshot.create", environment=environment).count() == 1
    assert messages_of(response) == ["shop/prod: publication queued for rendering."]


def test_second_publish_of_identical_content_creates_no_snapshot(
        login, tenant_owner, environment, django_capture_on_commit_callbacks):
    client = login(tenant_owner)
    with django_capture_on_commit_callbacks(execute=True):
        publish_action(client, environment)

    with django_capture_on_commit_callbacks(execute=True):
        publish_action(client, environment)

    assert Snapshot.objects.filter(environment=environment).count() == 1
    second = Publication.objects.filter(environment=environment).order_by("created_at").last()
    assert (second.state, second.deduplicated, second.snapshot.number) == ("ready", True, 1)


@pytest.mark.django_db(transaction=True)
def test_publish_action_reports_the_new_snapshot_then_that_nothing_changed(
        login, tenant_owner, environment):
    """Outside a test transaction the render runs as the publish commits, so the
    action can say what happened."""
    client = login(tenant_owner)

    first = publish_action(client, environment)
    second = publish_action(client, environment)

    assert messages_of(first) == ["shop/prod: published #1."]
    assert messages_of(second) == ["shop/prod: nothing changed since #1."]
    assert Snapshot.objects.filter(environment=environment).count() == 1


def test_publish_action_ignores_environments_outside_the_users_scope(
        login, staff_outsider, environment, django_capture_on_commit_callbacks):
    blog = Environment.objects.get(application__name="blog")

    with django_capture_on_commit_callbacks(execute=True):
        response = publish_action(login(staff_outsider), environment, blog)

    assert response.status_code == 200
    assert not Publication.objects.filter(environment=environment).exists()
    assert Snapshot.objects.get(environment=blog).number == 1
