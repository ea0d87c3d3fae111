"""The dashboard after a rollback: quarantined snapshots are flagged, the pending
panel says the inputs hold rolled-back changes, and owners reset them."""

import pytest

from apps.audit.models import Action, AuditEvent
from apps.releases import services as releases
from tests.factories import enrolled_agents, publish, session_client, start_rollout
from tests.rollouts.support import rollback

pytestmark = pytest.mark.django_db

PAGE = "/e/shop/prod/"


@pytest.fixture
def rolled_back(environment, superuser):
    publish(environment, superuser)
    releases.environment_update(environment=environment, release_policy="staged",
                                config=environment.config.replace("workers: 4", "workers: 8"),
                                actor=superuser)
    second = publish(environment, superuser)
    rollout = start_rollout(environment, second, enrolled_agents(environment, 1))
    rollback(rollout, reason="canary failed")
    return rollout


def test_the_page_flags_quarantine_and_offers_owners_the_reset(rolled_back, member):
    html = session_client(member("owner")).get(PAGE).content.decode()
    assert "quarantined" in html and f"in rollout {rolled_back.pk}" in html
    assert f"These changes were rolled back in rollout {rolled_back.pk}" in html
    assert "Reset inputs to #3" in html

    deployer_html = session_client(member("deployer")).get(PAGE).content.decode()
    assert "These changes were rolled back" in deployer_html
    assert "Reset inputs to" not in deployer_html


def test_an_owner_resets_the_inputs_from_the_dashboard(rolled_back, member, environment):
    refused = session_client(member("deployer")).post(f"{PAGE}reset-inputs/")
    assert refused.status_code == 403
    owner = session_client(member("owner"))
    response = owner.post(f"{PAGE}reset-inputs/")
    assert response.status_code == 302
    environment.refresh_from_db()
    assert "workers: 4" in environment.config
    assert AuditEvent.objects.filter(action=Action.ENVIRONMENT_RESET).count() == 1
    html = owner.get(PAGE).content.decode()
    assert "These changes were rolled back" not in html


@pytest.mark.parametrize("role", ["viewer", "deployer"])
@pytest.mark.parametrize(("action", "data"), [
    ("reset-inputs/", {}), ("release-policy/", {"release_policy": "direct",
                                                "expected_version": "1"})])
def test_owner_actions_refused_below_owner_name_the_owner_role(
        rolled_back, member, environment, role, action, data):
    environment.refresh_from_db()
    version = environment.version
    refused = session_client(member(role)).post(f"{PAGE}{action}", data)

    assert refused.status_code == 403
    html = refused.content.decode()
    assert "This needs the owner role on shop/prod." in html
    assert "deployer role on" not in html
    environment.refresh_from_db()
    assert environment.version == version and "workers: 8" in environment.config
