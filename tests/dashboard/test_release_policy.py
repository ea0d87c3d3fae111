"""The release policy in the dashboard: shown on the environment page, changed by
owners with the version the page showed; in a staged environment a publish leads
straight to starting a rollout of the new snapshot (through the publication's page
while it renders)."""

import re
import uuid

import pytest

from apps.audit.models import AuditEvent
from apps.environments.models import Environment
from apps.releases.services import environment_update, snapshot_publish
from apps.snapshots.models import Publication
from tests.dashboard.test_views import (
    HTMX,
    as_yaml,
    flash,
    releasable,  # noqa: F401 - a fixture
    release,
    section,
    text,
    url,
)
from tests.factories import enrolled_agents, render, session_client

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_cache")]
transactional = pytest.mark.django_db(transaction=True)


@pytest.fixture
def as_deployer(member):
    return session_client(member("deployer"))


@pytest.fixture
def as_owner(member):
    return session_client(member("owner"))


@pytest.fixture
def staged(releasable, superuser) -> Environment:  # noqa: F811 - the fixture above
    """The releasable shop/prod (#1 active), staged, with two enabled agents."""
    enrolled_agents(releasable, 2)
    return environment_update(environment=releasable, actor=superuser,
                              release_policy="staged")


def _publish(client, **headers):
    return client.post(url("descriptor"), {"descriptor": as_yaml(release()),
                                           "step": "publish"}, headers=headers)


# --- the policy on the page -------------------------------------------------------------


def test_the_page_head_shows_the_release_policy(staged, as_deployer):
    head = text(as_deployer.get(url("environment")))

    assert 'data-release-policy="staged"' in head
    assert "a rollout or an explicit activation releases it" in head
    assert "release-policy-form" not in head  # a deployer does not change it


def test_an_owner_switches_the_policy_with_the_version_shown(environment, first, as_owner):
    page = text(as_owner.get(url("environment")))
    form = re.search(r'<form id="release-policy-form".*?</form>', page, re.S).group(0)
    version = re.search(r'name="expected_version" value="(\d+)"', form).group(1)
    assert 'name="release_policy" value="staged"' in form

    response = as_owner.post(url("release-policy"), {"release_policy": "staged",
                                                     "expected_version": version})

    assert (response.status_code, response["Location"]) == (302, url("environment"))
    page = text(as_owner.get(response["Location"]))
    assert 'data-release-policy="staged"' in page
    assert "Release policy: Staged" in flash(page)
    environment.refresh_from_db()
    assert environment.is_staged
    assert AuditEvent.objects.filter(action="environment.settings").latest("id").data == {
        "fields": ["release_policy"]}


def test_a_stale_version_is_409_and_changes_nothing(environment, first, superuser, as_owner):
    environment_update(environment=environment, actor=superuser, poll_interval_s=60)

    response = as_owner.post(url("release-policy"), {"release_policy": "staged",
                                                     "expected_version": "1"}, headers=HTMX)

    assert response.status_code == 409
    assert "changed since you loaded it" in flash(text(response))
    environment.refresh_from_db()
    assert environment.release_policy == "direct"


@pytest.mark.parametrize("data", [{"release_policy": "sometimes", "expected_version": "1"},
                                  {"release_policy": "staged"}])
def test_a_bad_policy_form_is_400(data, environment, first, as_owner):
    response = as_owner.post(url("release-policy"), data, headers=HTMX)

    assert response.status_code == 400
    environment.refresh_from_db()
    assert environment.release_policy == "direct"


def test_a_deployer_may_not_switch_the_policy(environment, first, as_deployer):
    response = as_deployer.post(url("release-policy"), {"release_policy": "staged",
                                                        "expected_version": "1"},
                                headers=HTMX)

    assert response.status_code == 403
    environment.refresh_from_db()
    assert environment.release_policy == "direct"


# --- publish -> start a rollout ---------------------------------------------------------


@transactional
def test_a_staged_publish_leads_to_the_rollout_form_with_the_new_snapshot_chosen(
        staged, as_deployer):
    response = _publish(as_deployer)

    assert response.status_code == 302
    assert response["Location"] == url("rollout-new") + "?snapshot=2"
    page = text(as_deployer.get(response["Location"]))
    assert re.search(r'<option value="2" selected>#2 ', page)
    assert "Published #2: stored, not active" in flash(page)
    staged.refresh_from_db()
    assert staged.active_snapshot.number == 1


@transactional
def test_an_htmx_staged_publish_sends_the_browser_to_the_rollout_form(staged, as_deployer):
    response = _publish(as_deployer, **HTMX)

    assert response["HX-Redirect"] == url("rollout-new") + "?snapshot=2"


@transactional
def test_a_direct_publish_goes_back_to_the_environment(releasable, as_deployer):  # noqa: F811
    response = _publish(as_deployer)

    assert response["Location"] == url("environment")


def test_while_rendering_the_publication_page_says_so_then_offers_the_rollout(
        staged, as_deployer):
    response = _publish(as_deployer)  # the render waits for a commit that never comes
    publication = Publication.objects.get(state="rendering")

    assert response["Location"] == url("publication", publication.pk)
    page = text(as_deployer.get(response["Location"]))
    assert "Rendering…" in section(page, "publication")
    assert 'hx-get="' + url("publication", publication.pk) + '?panel=publication"' in page
    assert f"bw-snapshot-{publication.environment_id} from:body" in page  # refetched on live events

    render(publication)
    partial = text(as_deployer.get(url("publication", publication.pk) + "?panel=publication",
                                   headers=HTMX))

    assert partial.lstrip().startswith('<section id="publication"')
    assert "not active (the release policy is staged)" in partial
    assert f'href="{url("rollout-new")}?snapshot=2"' in partial


def test_the_rollout_form_ignores_a_snapshot_it_does_not_offer(staged, as_deployer):
    for junk in ("1", "99", "x", "-2"):  # #1 is active: nothing is offered
        page = text(as_deployer.get(url("rollout-new") + f"?snapshot={junk}"))
        assert 'id="nothing-to-roll-out"' in page
        assert "selected" not in page.split("<main>")[1]


def test_a_publication_of_another_environment_is_404(staged, as_deployer, blog, outsider):
    other = snapshot_publish(environment=blog, actor=outsider)

    assert as_deployer.get(url("publication", other.pk)).status_code == 404
    assert as_deployer.get(url("publication", uuid.uuid4())).status_code == 404
