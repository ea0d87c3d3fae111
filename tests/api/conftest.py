"""Fixtures for the API tests: shop/prod with a fallback file and two snapshots, the
world every route needs, and an owner's client."""

import pytest

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
