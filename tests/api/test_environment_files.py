"""GET, PUT and DELETE .../templates/<path> and .../fallback-files/<path>."""

import pytest
from django.test import override_settings

from apps.audit.models import AuditEvent
from apps.environments.models import FallbackFile, Template
from tests.api.support import ENV
from tests.api_helpers import assert_error

# (url segment, text field, model, audit kind)
KINDS = [
    pytest.param("templates", "source", Template, "template", id="template"),
    pytest.param("fallback-files", "content", FallbackFile, "fallback", id="fallback-file"),
]


@pytest.fixture
def existing(fallback_file):
    """The path of an existing file of each kind."""
    return {"templates": "nginx/shop.conf", "fallback-files": "www/index.html"}


def test_get_template_returns_its_source(environment, client_for):
    response = client_for("viewer").get(f"{ENV}/templates/nginx/shop.conf")

    assert response.status_code == 200
    assert response.json()["path"] == "nginx/shop.conf"
    assert "server_name {{ server_name }};" in response.json()["source"]


def test_get_fallback_file_returns_its_content(fallback_file, client_for):
    response = client_for("viewer").get(f"{ENV}/fallback-files/www/index.html")

    assert response.status_code == 200
    assert response.json() == {"path": "www/index.html", "content": "<p>maintenance</p>\n"}


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_get_missing_file_is_404(segment, field, model, kind, existing, client_for):
    response = client_for("viewer").get(f"{ENV}/{segment}/no/such.conf")

    error = assert_error(response, 404, "not_found")
    assert "no/such.conf" in error["message"]


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_owner_puts_a_new_file_and_it_is_stored_and_audited(segment, field, model, kind,
                                                            environment, owner_client):
    response = owner_client.put(f"{ENV}/{segment}/etc/app/new.conf", {field: "a = 1\n"},
                                format="json")

    assert response.status_code == 200
    assert response.json() == {"path": "etc/app/new.conf", field: "a = 1\n"}
    stored = model.objects.get(environment=environment, path="etc/app/new.conf")
    assert getattr(stored, field) == "a = 1\n"
    event = AuditEvent.objects.filter(environment=environment).order_by("-id").first()
    assert event.action == f"{kind}.create"
    assert event.data == {"path": "etc/app/new.conf"}


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_owner_replaces_an_existing_file(segment, field, model, kind, existing, owner_client):
    path = existing[segment]

    response = owner_client.put(f"{ENV}/{segment}/{path}", {field: "replaced\n"},
                                format="json")

    assert response.status_code == 200
    assert getattr(model.objects.get(path=path), field) == "replaced\n"
    assert AuditEvent.objects.order_by("-id").first().action == f"{kind}.update"
    assert owner_client.get(f"{ENV}/{segment}/{path}").json()[field] == "replaced\n"


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_put_keeps_text_exactly_including_surrounding_whitespace(segment, field, model, kind,
                                                                environment, owner_client):
    text = "  indented\n\n\ttabbed  \n\n"

    response = owner_client.put(f"{ENV}/{segment}/ws.conf", {field: text}, format="json")

    assert response.status_code == 200
    assert getattr(model.objects.get(path="ws.conf"), field) == text


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_put_without_the_text_field_is_400_naming_it(segment, field, model, kind, environment,
                                                     owner_client):
    response = owner_client.put(f"{ENV}/{segment}/a.conf", {}, format="json")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == field
    assert not model.objects.filter(path="a.conf").exists()


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
@pytest.mark.parametrize(
    ("url_path", "stored_path"),
    [
        ("a/../b", "a/../b"),
        ("%2e%2e/etc/passwd", "../etc/passwd"),
        ("nginx/%2e%2e/%2e%2e/etc/passwd", "nginx/../../etc/passwd"),
        ("/etc/passwd", "/etc/passwd"),  # the URL has a double slash
        ("./a.conf", "./a.conf"),
        ("a//b.conf", "a//b.conf"),
        ("a/b/", "a/b/"),
        ("a%5cb.conf", "a\\b.conf"),
        ("a%09b.conf", "a\tb.conf"),
        # The agent's temporary-file marker (agent/files.py) is reserved.
        ("conf.d/.shop.conf.bellwether-tmp-1a2b3c4d", "conf.d/.shop.conf.bellwether-tmp-1a2b3c4d"),
    ],
)
def test_put_with_an_unsafe_path_is_400_and_stores_nothing(
    segment, field, model, kind, url_path, stored_path, environment, owner_client
):
    response = owner_client.put(f"{ENV}/{segment}/{url_path}", {field: "x\n"}, format="json")

    error = assert_error(response, 400, "invalid_path")
    assert error["details"][0]["file"] == stored_path
    assert not model.objects.filter(path=stored_path).exists()


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_put_with_a_path_longer_than_255_characters_is_400(segment, field, model, kind,
                                                           environment, owner_client):
    response = owner_client.put(f"{ENV}/{segment}/{'a' * 256}", {field: "x\n"}, format="json")

    assert_error(response, 400, "invalid_path")


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_put_of_a_file_over_the_size_limit_is_400(segment, field, model, kind, environment,
                                                  owner_client, settings):
    settings.BELLWETHER_LIMITS = {**settings.BELLWETHER_LIMITS, "max_file_bytes": 10}

    response = owner_client.put(f"{ENV}/{segment}/big.conf", {field: "x" * 11}, format="json")

    assert_error(response, 400, "file_too_large")
    assert not model.objects.filter(path="big.conf").exists()


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
@pytest.mark.parametrize("path", ["www", "www/index.html/inner.html"])
def test_a_file_path_that_collides_with_a_directory_of_another_file_is_400(
    segment, field, model, kind, path, environment, owner_client
):
    # An agent cannot write both `www` and `www/index.html`.
    owner_client.put(f"{ENV}/{segment}/www/index.html", {field: "x\n"}, format="json")

    response = owner_client.put(f"{ENV}/{segment}/{path}", {field: "y\n"}, format="json")

    error = assert_error(response, 400, "invalid_path")
    assert error["details"][0]["file"] == path
    assert not model.objects.filter(path=path).exists()
    assert owner_client.get(f"{ENV}/preview").json()["valid"] is True


def test_put_template_with_syntax_error_is_400_naming_the_line(environment, owner_client):
    source = "server {\n    listen {{ listen }};\n\n    ssl {{ tls. }};\n}\n"

    response = owner_client.put(f"{ENV}/templates/nginx/tls.conf", {"source": source},
                                format="json")

    error = assert_error(response, 400, "template_syntax")
    (problem,) = error["details"]
    assert problem["file"] == "nginx/tls.conf"
    assert problem["line"] == 4
    assert error["message"].startswith("nginx/tls.conf:4:")
    assert not Template.objects.filter(path="nginx/tls.conf").exists()


@pytest.mark.parametrize(
    ("source", "line"),
    [("{{ unclosed\n", 1), ("ok\n{% for %}\n", 2), ("a\nb\n{{ x | }}\n", 3)],
)
def test_template_syntax_error_names_its_line(source, line, environment, owner_client):
    response = owner_client.put(f"{ENV}/templates/t.conf", {"source": source}, format="json")

    error = assert_error(response, 400, "template_syntax")
    assert error["details"][0]["line"] == line
    assert error["message"].startswith(f"t.conf:{line}:")


def test_fallback_file_is_literal_so_template_syntax_is_accepted(environment, owner_client):
    content = "{% if broken\n"

    response = owner_client.put(f"{ENV}/fallback-files/raw.txt", {"content": content},
                                format="json")

    assert response.status_code == 200
    assert FallbackFile.objects.get(path="raw.txt").content == content


def test_replacing_a_template_with_a_syntax_error_keeps_the_old_source(environment,
                                                                      owner_client):
    before = Template.objects.get(path="nginx/shop.conf").source

    response = owner_client.put(f"{ENV}/templates/nginx/shop.conf",
                                {"source": "{% for x in %}"}, format="json")

    assert_error(response, 400, "template_syntax")
    assert Template.objects.get(path="nginx/shop.conf").source == before


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_owner_deletes_a_file_and_it_is_gone_and_audited(segment, field, model, kind,
                                                         existing, owner_client, environment):
    path = existing[segment]

    response = owner_client.delete(f"{ENV}/{segment}/{path}")

    assert response.status_code == 204
    assert response.content == b""
    assert not model.objects.filter(path=path).exists()
    assert AuditEvent.objects.order_by("-id").first().action == f"{kind}.delete"
    assert_error(owner_client.get(f"{ENV}/{segment}/{path}"), 404, "not_found")


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
def test_deleting_a_missing_file_is_404_and_records_nothing(segment, field, model, kind,
                                                            existing, owner_client):
    before = AuditEvent.objects.count()

    response = owner_client.delete(f"{ENV}/{segment}/no/such.conf")

    assert_error(response, 404, "not_found")
    assert AuditEvent.objects.count() == before


@pytest.mark.parametrize(("segment", "field", "model", "kind"), KINDS)
@pytest.mark.parametrize("role", ["viewer", "deployer"])
def test_changing_files_needs_the_owner_role(segment, field, model, kind, role, existing,
                                             client_for):
    client = client_for(role)
    path = existing[segment]
    before = getattr(model.objects.get(path=path), field)

    put = client.put(f"{ENV}/{segment}/{path}", {field: "changed\n"}, format="json")
    delete = client.delete(f"{ENV}/{segment}/{path}")

    assert_error(put, 403, "permission_denied")
    assert_error(delete, 403, "permission_denied")
    assert getattr(model.objects.get(path=path), field) == before


def test_put_body_over_the_upload_limit_is_413(environment, owner_client):
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=64):
        response = owner_client.put(f"{ENV}/templates/big.conf", {"source": "y" * 200},
                                    format="json")

    assert_error(response, 413, "too_large")
    assert not Template.objects.filter(path="big.conf").exists()
