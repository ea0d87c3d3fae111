"""A body the server did not read never means "everything", and unknown API paths
answer the JSON 404 for every method (CSRF is not consulted for a route that does
not exist)."""

import pytest

from apps.fleet.models import Agent
from tests import factories
from tests.api_helpers import assert_error

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("body", [None, "{}", '{"unknown": 1}'])
def test_patching_an_agent_with_nothing_to_change_is_400_and_changes_nothing(
        environment, superuser, body):
    enrolled = factories.enrolled_agent(environment, actor=superuser)
    client = factories.api_client_for(superuser)
    url = f"/api/v1/agents/{enrolled.agent.pk}"
    if body is None:
        response = client.patch(url)
    else:
        response = client.patch(url, data=body, content_type="application/json")
    assert_error(response, 400, "empty_body")
    agent = Agent.objects.get(pk=enrolled.agent.pk)
    assert (agent.enabled, agent.generation) == (True, enrolled.agent.generation)


def test_patching_enabled_false_disables_the_agent(environment, superuser):
    enrolled = factories.enrolled_agent(environment, actor=superuser)
    response = factories.api_client_for(superuser).patch(
        f"/api/v1/agents/{enrolled.agent.pk}", {"enabled": False}, format="json")
    assert response.status_code == 200
    assert Agent.objects.get(pk=enrolled.agent.pk).enabled is False


@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete", "options"])
@pytest.mark.parametrize("path", ["/api/nothing", "/api/v1/nothing/here",
                                  "/api/v1/environments/shop/prod/nothing"])
def test_unknown_api_paths_answer_the_json_404_for_every_method_even_with_a_session(
        superuser, method, path):
    client = factories.session_client(superuser, enforce_csrf_checks=True)
    response = client.generic(method.upper(), path, "{}", content_type="application/json")
    assert_error(response, 404, "not_found")
