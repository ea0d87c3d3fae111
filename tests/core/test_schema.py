"""The OpenAPI schema is complete: it generates and validates without warnings."""

from django.core.management import call_command


def test_openapi_schema_generates_without_warnings(tmp_path):
    out = tmp_path / "schema.yaml"
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(out))
    text = out.read_text()
    assert "/api/v1/environments/{application}/{environment}/publish" in text
    assert "apiToken" in text
