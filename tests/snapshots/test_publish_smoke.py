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


def test_with_isolation_on_a_publish_renders_in_a_child_process(environment, superuser,
                                                                settings, monkeypatch):
    """Production's default (tests render in-process): the publish's render goes to
    configlang.isolated, whose child answers the same snapshot."""
    from apps.snapshots import services

    children = []
    isolated = services.render_isolated

    def render_isolated(*args, **kwargs):
        children.append(1)
        return isolated(*args, **kwargs)

    monkeypatch.setattr(services, "render_isolated", render_isolated)
    settings.BELLWETHER_RENDER_ISOLATED = True

    publication = snapshot_publish(environment=environment, actor=superuser)
    snapshot = publication_complete(publication_id=publication.pk).snapshot

    assert children == [1]
    assert snapshot.state == "ready", snapshot.report
    assert "server_name shop.example.com;" in snapshot.files[0]["content"]
