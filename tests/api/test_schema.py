"""GET /api/schema/ (OpenAPI) and GET /api/docs/ (Swagger UI)."""

import pytest
from django.test import Client

from tests.api.support import ROUTES

E = "/api/v1/environments/{application}/{environment}"
S = f"{E}/snapshots/{{number}}"
DOCUMENTED = {
    "/api/v1/environments": {"get"},
    E: {"get", "patch"},
    f"{E}/templates/{{path}}": {"get", "put", "delete"},
    f"{E}/fallback-files/{{path}}": {"get", "put", "delete"},
    f"{E}/preview": {"get"},
    f"{E}/publish": {"post"},
    f"{E}/pending": {"get"},
    f"{E}/audit": {"get"},
    f"{E}/snapshots": {"get"},
    S: {"get"},
    f"{S}/diff": {"get"},
    f"{S}/rollback": {"post"},
    "/api/v1/publications/{publication_id}": {"get"},
    f"{E}/retention": {"get"},
}
FLEET_DOCUMENTED = {
    f"{E}/agents": {"get"},
    f"{E}/enrollment-tokens": {"post"},
    f"{S}/activate": {"post"},
    f"{S}/deploy": {"post"},
    "/api/v1/agents/{agent_id}": {"get", "patch"},
    "/api/v1/agents/{agent_id}/deployments": {"get"},
    "/api/v1/agents/{agent_id}/token/rotate": {"post"},
    "/api/v1/agents/{agent_id}/token/revoke": {"post"},
    "/api/v1/agent/enroll": {"post"},
    "/api/v1/agent/desired": {"get"},
    "/api/v1/agent/snapshots/{number}/bundle": {"get"},
    "/api/v1/agent/reports": {"post"},
    "/api/v1/agent/drift": {"post"},
    "/api/v1/agents/{agent_id}/pin": {"post"},
    "/api/v1/agents/{agent_id}/pin/release": {"post"},
    "/api/v1/agents/{agent_id}/decommission": {"post"},
}
LAYERS_DOCUMENTED = {"/api/v1/descriptors": {"post"}}
# Tested in tests/api/test_quarantine.py (they need a rolled-back rollout).
HISTORY_DOCUMENTED = {f"{E}/promotion": {"get"}, f"{E}/promote": {"post"},
                      f"{S}/remove": {"post"},
                      "/api/v1/publications/{publication_id}/confirm": {"post"}}
QUARANTINE_DOCUMENTED = {f"{S}/quarantine/lift": {"post"}, f"{E}/reset-inputs": {"post"}}
ROLLOUTS_DOCUMENTED = {
    f"{E}/rollouts": {"get", "post"},
    "/api/v1/rollouts/{rollout_id}": {"get", "delete"},
    "/api/v1/rollouts/{rollout_id}/confirm": {"post"},
    "/api/v1/rollouts/{rollout_id}/rollback": {"post"},
    "/api/v1/rollouts/{rollout_id}/release-pins": {"post"},
    "/api/v1/rollouts/{rollout_id}/pause": {"post"},
    "/api/v1/rollouts/{rollout_id}/resume": {"post"},
}
STRATEGIES_DOCUMENTED = {
    "/api/v1/strategies": {"get", "post"},
    "/api/v1/strategies/{strategy_id}": {"get", "delete"},
    f"{E}/default-strategy": {"get", "put", "delete"},
}
WEBHOOKS_DOCUMENTED = {
    f"{E}/webhooks": {"get", "post"},
    "/api/v1/webhooks/{endpoint_id}": {"get", "patch", "delete"},
    "/api/v1/webhooks/{endpoint_id}/rotate-secret": {"post"},
    "/api/v1/webhooks/{endpoint_id}/deliveries": {"get"},
}
GOVERNANCE_DOCUMENTED = {  # tested in tests/governance/test_api.py
    f"{E}/governance": {"get", "put"},
    f"{E}/releases": {"get", "post"},
    f"{E}/windows": {"get", "post"},
    f"{E}/freeze-override": {"post"},
    f"{E}/schedules": {"get"},
    "/api/v1/releases/{release_id}": {"get", "patch"},
    "/api/v1/releases/{release_id}/approve": {"post"},
    "/api/v1/releases/{release_id}/reject": {"post"},
    "/api/v1/releases/{release_id}/skip": {"post"},
    "/api/v1/releases/{release_id}/withdraw": {"post"},
    "/api/v1/releases/{release_id}/schedule": {"post"},
    "/api/v1/schedules/{schedule_id}/cancel": {"post"},
    "/api/v1/windows/{window_id}": {"delete"},
}


@pytest.fixture
def schema(api_client, superuser):
    response = api_client(superuser).get("/api/schema/?format=json")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    return response.json()


def _response_schema(schema: dict, path: str, method: str = "get") -> dict:
    return schema["paths"][path][method]["responses"]["200"]["content"]["application/json"][
        "schema"
    ]


def test_schema_documents_every_api_route_and_method(schema):
    documented = {
        path: {m for m in ops if m in {"get", "post", "put", "patch", "delete"}}
        for path, ops in schema["paths"].items()
    }

    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "Bellwether API"
    assert documented == (DOCUMENTED | FLEET_DOCUMENTED | LAYERS_DOCUMENTED
                          | ROLLOUTS_DOCUMENTED | QUARANTINE_DOCUMENTED | HISTORY_DOCUMENTED
                          | STRATEGIES_DOCUMENTED | WEBHOOKS_DOCUMENTED | GOVERNANCE_DOCUMENTED)
    assert sum(len(methods) for methods in DOCUMENTED.values()) == len(ROUTES)


def test_schema_is_served_as_yaml_by_default(api_client, superuser):
    response = api_client(superuser).get("/api/schema/")

    assert response.status_code == 200
    assert b"openapi: 3." in response.content
    assert b"/api/v1/environments/{application}/{environment}/publish:" in response.content


def test_schema_describes_the_diff_against_parameter(schema):
    parameters = schema["paths"][f"{S}/diff"]["get"]["parameters"]

    assert "against" in {p["name"] for p in parameters}


def test_schema_gives_preview_diff_and_pending_their_own_response_shapes(schema):
    preview = _response_schema(schema, f"{E}/preview")
    diff = _response_schema(schema, f"{S}/diff")
    pending = _response_schema(schema, f"{E}/pending")

    assert len({preview["$ref"], diff["$ref"], pending["$ref"]}) == 3


def test_schema_documents_bearer_token_authentication(schema):
    schemes = schema["components"]["securitySchemes"].values()

    assert {"type": "http", "scheme": "bearer"} in [
        {k: s.get(k) for k in ("type", "scheme")} for s in schemes
    ]


def test_docs_page_is_html_swagger_ui(client):
    response = client.get("/api/docs/")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    content = response.content.decode()
    assert "swagger-ui" in content
    assert "cdn" not in content.lower()  # served from the sidecar's static files
    # Its script is a file of its own (the CSP allows no inline script): ?script.
    assert "<script>" not in content
    script = client.get("/api/docs/?script")
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "/api/schema/" in script.content.decode()


def test_docs_route_does_not_accept_writes(client):
    response = client.post("/api/docs/")

    assert response.status_code == 405


def _operations(schema):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method in {"get", "post", "put", "patch", "delete"}:
                yield path, method, operation


def test_every_operation_documents_its_error_answers_with_the_envelope(schema):
    envelope = schema["components"]["schemas"]["Error"]
    assert envelope["required"] == ["error"]
    assert envelope["properties"]["error"]["required"] == ["code", "message"]
    for path, method, operation in _operations(schema):
        expected = {"400", "401", "403", "404", "429", "503"}
        if method != "get":
            expected.add("409")
        if method in {"post", "put", "patch"}:
            expected.add("413")
        responses = operation["responses"]
        assert expected <= set(responses), (path, method, sorted(responses))
        for status in expected:
            content = responses[status]["content"]["application/json"]["schema"]
            assert content == {"$ref": "#/components/schemas/Error"}, (path, method, status)
            assert responses[status]["description"]


def test_success_answers_keep_their_own_schemas(schema):
    publish = schema["paths"][f"{E}/publish"]["post"]["responses"]
    assert {"200", "201", "202"} <= set(publish)
    assert publish["201"]["content"]["application/json"]["schema"]["$ref"] \
        != "#/components/schemas/Error"


@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
def test_unknown_api_paths_answer_the_json_404_for_every_method_even_with_a_session(
        method, superuser):
    client = Client(enforce_csrf_checks=True)
    client.force_login(superuser)  # a session cookie, and no CSRF token
    response = getattr(client, method)("/api/v1/no/such/route")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_the_diff_against_parameter_states_its_minimum(schema):
    [against] = [p for p in schema["paths"][f"{S}/diff"]["get"]["parameters"]
                 if p["name"] == "against"]
    assert against["schema"]["minimum"] == 1
    assert against["in"] == "query" and not against.get("required", False)
