"""Fixtures for the API tests: shop/prod with a fallback file and two snapshots, the
world every route needs, and an owner's client; and one world built per module for
the modules of refusals (hostile_world)."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.environments.services import environment_file_put
from apps.snapshots.models import Publication
from tests import factories


@pytest.fixture
def fallback_file(environment, superuser):
    return environment_file_put(environment=environment, kind="fallback",
                                path="www/index.html", text="<p>maintenance</p>\n",
                                actor=superuser)


@pytest.fixture
def snapshots(environment, fallback_file, superuser):
    """shop/prod with two ready snapshots: #1 (workers 4) and #2 (workers 8)."""
    first = factories.publish(environment, superuser)
    second = factories.publish_variant(environment, superuser, workers=8)
    assert (first.number, first.state, second.number, second.state) == (1, "ready", 2, "ready")
    return first, second


@pytest.fixture
def world(snapshots, outsider):
    """Everything ROUTES needs to exist: shop/prod with files, snapshots and a
    publication; blog/prod owned by the outsider."""
    publication = Publication.objects.get(snapshot=snapshots[1])
    return {"publication": str(publication.pk)}


@pytest.fixture
def route_url(world):
    def make(path: str, env: str = "shop/prod") -> str:
        return path.format(env=env, publication=world["publication"])

    return make


@pytest.fixture
def owner_client(client_for):
    """An API client of an owner of the tenant."""
    return client_for("owner")


# --- one world for a module of refusals --------------------------------------------------


@pytest.fixture(scope="module")
def shared_world(module_transaction):
    """Built once for the module (every test here only reads it, or changes it within
    its own savepoint): shop/prod with a fallback file, two snapshots, two agents on
    #1, a running rollout of #2; governance and webhook objects; the value of every
    path parameter and the secrets of a superuser's and an agent's token."""
    superuser = factories.superuser()
    application = factories.application(factories.tenant(actor=superuser), actor=superuser)
    environment = factories.environment(application, "prod", templates=factories.SHOP_TEMPLATES,
                                        fallback_files={"www/index.html": "<p>down</p>\n"},
                                        actor=superuser)
    first = factories.publish(environment, superuser)
    second = factories.publish_variant(environment, superuser, workers=8)
    agents = factories.enrolled_agents(environment, 2, actor=superuser)
    for agent in agents:
        factories.ack(agent, first)
    rollout = factories.start_rollout(environment, second, [agents[0].agent], actor=superuser)
    publication = Publication.objects.filter(snapshot=second).first()
    values = {"application": "shop", "environment": "prod", "number": "2",
              "agent_id": str(agents[1].agent.pk), "rollout_id": str(rollout.pk),
              "publication_id": str(publication.pk), **_governed(environment, second,
                                                               superuser)}
    return {"values": values, "user": factories.api_token(superuser)[1],
            "agent": agents[1].token, "environment": environment.pk,
            "superuser": superuser.pk}


@pytest.fixture
def hostile_world(shared_world, db, empty_cache):
    """The shared world's path values, its superuser, a superuser's client and an
    agent's client."""
    return {"values": shared_world["values"],
            "superuser": get_user_model().objects.get(pk=shared_world["superuser"]),
            "user": factories.bearer_client(shared_world["user"]),
            "agent": factories.bearer_client(shared_world["agent"])}


def _governed(environment, snapshot, superuser) -> dict:
    """Path values of governance and webhook objects: a release, a freeze window far
    ahead, a webhook endpoint, a built-in strategy; a schedule id no row has."""
    from apps.governance import rules as governance_rules
    from apps.governance import services as governance
    from apps.governance import windows
    from apps.rollouts.models import RolloutStrategy
    from apps.webhooks.services import endpoint_create

    release = governance.release_submit(environment=environment, snapshot=snapshot,
                                        plan=governance_rules.activation_plan(),
                                        actor=superuser)
    later = timezone.now() + timedelta(days=300)
    window = windows.window_create(environment=environment, actor=superuser, kind="freeze",
                                   name="later", starts_at=later,
                                   ends_at=later + timedelta(hours=1))
    endpoint, _ = endpoint_create(environment=environment, url="https://hooks.example.com/x",
                                  events=["snapshot.published"], actor=superuser)
    return {"release_id": str(release.pk), "window_id": str(window.pk),
            "endpoint_id": str(endpoint.pk), "schedule_id": "999999",
            "strategy_id": str(RolloutStrategy.objects.order_by("pk").first().pk)}
