"""The dashboard's promotion, retention and confirmation pages, through the test client:
the same services as the API, role-aware, htmx partials where htmx asks."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.environments.services import environment_file_put, policy_publish
from apps.releases import services as releases
from apps.snapshots.models import Publication, Snapshot
from tests import factories

pytestmark = pytest.mark.django_db

PAGE = "/e/shop/prod/"
HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def staging(environment, application, superuser):
    """shop/prod #1 active; shop/staging running release 2.4.0 (params.feature on)."""
    policy_publish(content={"descriptor_policy": {"params": ["feature"]}}, actor=superuser)
    template = "feature={{ params.feature | default('off') }}\n"
    for env in (environment,):
        releases.environment_update(environment=env, actor=superuser,
                                    config=env.config + "params: {}\n")
        environment_file_put(environment=env, kind="template", path="release.txt",
                             text=template, actor=superuser)
    factories.publish(environment, superuser)
    env = factories.environment(application, "staging", config=factories.CONFIG + "params: {}\n",
                                templates={"release.txt": template}, actor=superuser)
    descriptor = {"apiVersion": "bellwether/v1", "application": "shop",
                  "environment": "staging", "id": "rel-1", "version": "1",
                  "params": {"feature": "on"}}
    factories.render(releases.descriptor_submit(environment=env, descriptor=descriptor,
                                                actor=superuser)[0])
    return env


def test_promote_previews_the_diff_and_promotes(staging, member):
    client = factories.session_client(member("deployer"))

    preview = client.get(f"{PAGE}promote/", {"source": "staging"}, **HX)

    assert preview.status_code == 200
    html = preview.content.decode()
    assert "shop/staging #1" in html and "feature=on" in html and 'id="preview"' in html
    response = client.post(f"{PAGE}promote/", {"source": "staging", "number": "1"})
    assert response.status_code == 302
    publication = Publication.objects.filter(environment__name="prod").latest("created_at")
    assert publication.source["promoted_from"]["environment"] == "shop/staging"
    assert AuditEvent.objects.filter(action=Action.SNAPSHOT_PROMOTE).count() == 1


def test_promote_by_a_viewer_is_refused_and_a_stale_number_is_named(staging, member):
    viewer = factories.session_client(member("viewer"))
    assert viewer.post(f"{PAGE}promote/", {"source": "staging"}).status_code == 403
    deployer = factories.session_client(member("deployer"))
    stale = deployer.post(f"{PAGE}promote/", {"source": "staging", "number": "7"})
    assert stale.status_code == 409 and "now runs #1" in stale.content.decode()
    unknown = deployer.get(f"{PAGE}promote/", {"source": "blog"})
    assert unknown.status_code == 400
    assert not AuditEvent.objects.filter(action=Action.SNAPSHOT_PROMOTE).exists()


@pytest.fixture
def three(environment, superuser):
    return [factories.publish_variant(environment, superuser, workers=10 + i) for i in range(3)]


def test_retention_shows_bytes_against_bounds_and_why_each_is_kept(three, member):
    html = factories.session_client(member("viewer")).get(f"{PAGE}retention/").content.decode()
    assert "of 100 snapshots" in html and "1.0\xa0GB" in html
    assert "the environment&#x27;s active snapshot" in html or "active snapshot" in html
    assert "nothing: may be removed" in html
    assert 'name="reason"' not in html  # only owners remove


def test_an_owner_removes_with_a_reason_over_htmx(three, environment, member):
    client = factories.session_client(member("owner"))

    missing = client.post(f"{PAGE}snapshots/1/remove/", {"reason": ""}, **HX)
    assert missing.status_code == 400
    kept = client.post(f"{PAGE}snapshots/3/remove/", {"reason": "x"}, **HX)
    assert kept.status_code == 409
    done = client.post(f"{PAGE}snapshots/1/remove/", {"reason": "obsolete"}, **HX)

    assert done.status_code == 200 and 'id="retention"' in done.content.decode()
    assert list(Snapshot.objects.filter(environment=environment).values_list(
        "number", flat=True).order_by("number")) == [2, 3]


def test_a_deployer_cannot_remove(three, environment, member):
    client = factories.session_client(member("deployer"))
    assert client.post(f"{PAGE}snapshots/1/remove/", {"reason": "x"}).status_code == 403
    assert Snapshot.objects.filter(environment=environment).count() == 3


def test_a_held_publication_says_why_and_the_checkbox_confirms_it(first, environment,
                                                                   superuser, member):
    environment_file_put(environment=environment, kind="template", path="nginx/shop.conf",
                         text="", actor=superuser)
    held = factories.publication(environment, superuser)
    url = f"{PAGE}publications/{held.pk}/"
    client = factories.session_client(member("deployer"))

    html = client.get(url).content.decode()
    assert "emptied: <code>nginx/shop.conf</code>" in html and "Confirm and activate" in html
    client.post(f"{url}confirm/", {})  # without the box: nothing
    assert Publication.objects.get(pk=held.pk).confirmed is False
    client.post(f"{url}confirm/", {"confirm": "on"})

    held.refresh_from_db()
    environment.refresh_from_db()
    assert held.confirmed and held.activated and environment.active_snapshot == held.snapshot
