"""The snapshots panel says where each queued render stands: waiting for a worker
since it was queued, or rendering since a worker claimed it."""

from datetime import timedelta

from apps.releases.services import snapshot_publish
from apps.snapshots.models import Publication
from tests import factories


def _panel(environment, superuser) -> str:
    client = factories.session_client(superuser)
    response = client.get(f"/e/{environment.full_name}/?panel=snapshots",
                          headers={"HX-Request": "true"})
    assert response.status_code == 200
    return response.content.decode()


def test_a_queued_publication_waits_for_a_worker_then_renders(environment, superuser):
    queued = snapshot_publish(environment=environment, actor=superuser)
    created = Publication.objects.get(pk=queued.pk).created_at

    html = _panel(environment, superuser)
    assert f"waiting for a worker since {created:%Y-%m-%d %H:%M:%S} UTC" in html

    claimed = created + timedelta(seconds=3)
    Publication.objects.filter(pk=queued.pk).update(claimed_at=claimed)
    html = _panel(environment, superuser)
    assert f"rendering since {claimed:%Y-%m-%d %H:%M:%S} UTC" in html
    assert "waiting for a worker" not in html


def test_nothing_is_said_once_the_publication_finished(environment, superuser):
    factories.publish(environment, superuser)

    html = _panel(environment, superuser)
    assert "waiting for a worker" not in html and "rendering since" not in html
