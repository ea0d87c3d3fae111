from apps.releases.publishing import publication_complete
from apps.releases.services import snapshot_publish


def test_publish_renders_a_ready_snapshot(environment, superuser):
    publication = snapshot_publish(environment=environment, actor=superuser)
    publication = publication_complete(publication_id=publication.pk)
    snapshot = publication.snapshot
    assert snapshot.state == "ready", snapshot.report
    assert snapshot.number == 1
    assert [f["path"] for f in snapshot.files] == ["nginx/shop.conf", "shop/app.json"]
    assert "server_name shop.example.com;" in snapshot.files[0]["content"]
