"""Saving the environment change page goes through the services: each change is
validated the same way as through the API and writes its audit event."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.models import FallbackFile, Template
from apps.fleet.models import PollInvalidation
from apps.releases import services as releases
from tests import factories
from tests.admin.support import ENVIRONMENTS, change_url, environment_form, template_rows

NEW_CONFIG = """listen: 8080
server_name: shop.example.com
upstreams:
  - 10.0.0.1:8080
log_level: debug
workers: 6"""

# Line 3 indents a key under a scalar: "mapping values are not allowed in this context".
INVALID_CONFIG = """listen: 80
server_name: shop.example.com
  workers: 4
log_level: info"""

NEW_TEMPLATE = "upstream shop {\n{% for u in upstreams %}    server {{ u }};\n{% endfor %}}"


@pytest.fixture
def owner_client(login, tenant_owner):
    return login(tenant_owner)


def post_change(client, environment, data):
    return client.post(change_url(ENVIRONMENTS, environment.pk), data)


def new_events(since: int):
    return list(AuditEvent.objects.filter(pk__gt=since).order_by("pk"))


def last_event_id() -> int:
    return AuditEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def file_events(events, kind: str) -> list[tuple[str, str]]:
    return [(e.action, e.data["path"]) for e in events if e.action.startswith(f"{kind}.")]


def test_new_config_is_saved_with_an_environment_update_event(
        owner_client, tenant_owner, environment):
    since = last_event_id()

    response = post_change(owner_client, environment,
                           environment_form(environment, config=NEW_CONFIG))

    assert response.status_code == 302, response.context and response.context["errors"]
    environment.refresh_from_db()
    assert environment.config == NEW_CONFIG
    updates = [e for e in new_events(since) if e.action == "environment.update"]
    assert len(updates) == 1
    assert updates[0].actor == tenant_owner
    assert updates[0].environment == environment
    assert updates[0].data == {"fields": ["config"]}


@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf-as-browsers-submit"])
def test_saving_the_change_page_without_edits_changes_nothing(
        newline, owner_client, environment):
    """Browsers submit textarea content with CRLF line endings; the stored config and
    templates end with a newline. Neither may turn an untouched save into a change."""
    config_before = environment.config
    sources_before = {t.path: t.source for t in environment.templates.all()}
    since = last_event_id()
    data = environment_form(environment)
    for key in [k for k in data if k == "config" or k.endswith("-source")]:
        data[key] = data[key].replace("\n", newline)

    response = post_change(owner_client, environment, data)

    assert response.status_code == 302
    environment.refresh_from_db()
    assert environment.config == config_before
    assert {t.path: t.source for t in environment.templates.all()} == sources_before
    assert [e.action for e in new_events(since)] == []


def test_invalid_yaml_rerenders_the_form_with_an_error_naming_the_line(
        owner_client, environment):
    config_before = environment.config
    since = last_event_id()

    response = post_change(owner_client, environment,
                           environment_form(environment, config=INVALID_CONFIG))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["config"]
    assert len(errors) == 1
    assert "config:3:" in errors[0], errors
    assert "mapping values are not allowed in this context" in errors[0]
    environment.refresh_from_db()
    assert environment.config == config_before
    assert new_events(since) == []


def test_adding_a_template_in_the_inline_writes_template_create(
        owner_client, tenant_owner, environment):
    since = last_event_id()
    rows = template_rows(environment) + [{"path": "nginx/upstream.conf",
                                          "source": NEW_TEMPLATE}]

    response = post_change(owner_client, environment,
                           environment_form(environment, templates=rows))

    assert response.status_code == 302
    added = environment.templates.get(path="nginx/upstream.conf")
    assert added.source == NEW_TEMPLATE
    events = new_events(since)
    assert ("template.create", "nginx/upstream.conf") in file_events(events, "template")
    assert all(e.actor == tenant_owner for e in events)


def test_changing_a_template_in_the_inline_writes_template_update(owner_client, environment):
    since = last_event_id()
    rows = template_rows(environment)
    assert rows[0]["path"] == "nginx/shop.conf"
    rows[0]["source"] = NEW_TEMPLATE

    response = post_change(owner_client, environment,
                           environment_form(environment, templates=rows))

    assert response.status_code == 302
    assert environment.templates.get(path="nginx/shop.conf").source == NEW_TEMPLATE
    assert ("template.update", "nginx/shop.conf") in file_events(new_events(since), "template")
    assert environment.templates.count() == 2


def test_renaming_a_template_in_the_inline_deletes_the_old_path_and_creates_the_new(
        owner_client, environment):
    since = last_event_id()
    rows = template_rows(environment)
    rows[0]["path"] = "nginx/sites-enabled/shop.conf"

    response = post_change(owner_client, environment,
                           environment_form(environment, templates=rows))

    assert response.status_code == 302
    assert sorted(environment.templates.values_list("path", flat=True)) == [
        "nginx/sites-enabled/shop.conf", "shop/app.json"]
    events = file_events(new_events(since), "template")
    assert ("template.delete", "nginx/shop.conf") in events
    assert ("template.create", "nginx/sites-enabled/shop.conf") in events
    assert events.index(("template.delete", "nginx/shop.conf")) < events.index(
        ("template.create", "nginx/sites-enabled/shop.conf"))


def test_deleting_a_template_in_the_inline_writes_template_delete(owner_client, environment):
    since = last_event_id()
    rows = template_rows(environment)
    rows[1]["DELETE"] = True

    response = post_change(owner_client, environment,
                           environment_form(environment, templates=rows))

    assert response.status_code == 302
    assert list(environment.templates.values_list("path", flat=True)) == ["nginx/shop.conf"]
    events = file_events(new_events(since), "template")
    assert ("template.delete", "shop/app.json") in events
    assert ("template.update", "shop/app.json") not in events


def test_template_with_a_syntax_error_shows_an_inline_error_and_saves_nothing(
        owner_client, environment):
    sources_before = {t.path: t.source for t in environment.templates.all()}
    config_before = environment.config
    since = last_event_id()
    rows = template_rows(environment)
    rows[0]["source"] = "server {\n    listen {{ listen };\n}"
    rows.append({"path": "nginx/extra.conf", "source": "# fine"})

    response = post_change(owner_client, environment, environment_form(
        environment, templates=rows, config=NEW_CONFIG))

    assert response.status_code == 200
    templates_formset = response.context["inline_admin_formsets"][0].formset
    assert templates_formset.prefix == "templates"
    errors = templates_formset.forms[0].non_field_errors()
    assert len(errors) == 1
    assert errors[0].startswith("nginx/shop.conf:2:"), errors
    environment.refresh_from_db()
    assert environment.config == config_before
    assert {t.path: t.source for t in environment.templates.all()} == sources_before
    assert new_events(since) == []


def test_template_with_an_unsafe_path_is_refused(owner_client, environment):
    since = last_event_id()
    rows = template_rows(environment) + [{"path": "../etc/passwd", "source": "x"}]

    response = post_change(owner_client, environment,
                           environment_form(environment, templates=rows))

    assert response.status_code == 200
    errors = response.context["inline_admin_formsets"][0].formset.forms[2].non_field_errors()
    assert "normalised" in errors[0]
    assert not Template.objects.filter(path="../etc/passwd").exists()
    assert new_events(since) == []


def test_adding_a_fallback_file_in_the_inline_writes_fallback_create(
        owner_client, environment):
    since = last_event_id()

    response = post_change(owner_client, environment, environment_form(
        environment,
        fallback_files=[{"path": "www/index.html", "content": "<p>maintenance</p>"}]))

    assert response.status_code == 302
    fallback = FallbackFile.objects.get(environment=environment)
    assert (fallback.path, fallback.content) == ("www/index.html", "<p>maintenance</p>")
    assert ("fallback.create", "www/index.html") in file_events(new_events(since), "fallback")


def test_changing_owners_writes_environment_owners(
        owner_client, tenant_owner, make_user, environment, tenant, superuser):
    alice = make_user("alice")
    factories.membership(tenant, alice, "viewer", actor=superuser)
    since = last_event_id()

    response = post_change(owner_client, environment,
                           environment_form(environment, owners=[str(alice.pk)]))

    assert response.status_code == 302
    assert list(environment.owners.all()) == [alice]
    owner_events = [e for e in new_events(since) if e.action == "environment.owners"]
    assert len(owner_events) == 1
    assert owner_events[0].data == {"owners": ["alice"]}
    assert owner_events[0].actor == tenant_owner


def test_a_user_of_no_tenant_of_the_environment_cannot_be_named_an_owner(
        owner_client, make_user, environment):
    stranger = make_user("stranger")

    response = post_change(owner_client, environment,
                           environment_form(environment, owners=[str(stranger.pk)]))

    assert response.status_code == 200
    assert "owners" in response.context["adminform"].form.errors
    assert not environment.owners.exists()


def test_environment_owner_saves_through_the_same_services(
        login, environment_owner, environment):
    since = last_event_id()

    response = post_change(login(environment_owner), environment, environment_form(
        environment, config=NEW_CONFIG, owners=[str(environment_owner.pk)]))

    assert response.status_code == 302
    environment.refresh_from_db()
    assert environment.config == NEW_CONFIG
    updates = [e for e in new_events(since) if e.action == "environment.update"]
    assert [e.actor for e in updates] == [environment_owner]
    assert not [e for e in new_events(since) if e.action == "environment.owners"]


def test_a_template_path_that_is_a_directory_of_another_is_a_form_error(
        owner_client, environment):
    since = last_event_id()
    rows = template_rows(environment) + [{"path": "nginx", "source": "x\n"}]

    response = post_change(owner_client, environment,
                           environment_form(environment, templates=rows))

    assert response.status_code == 200
    formset = response.context["inline_admin_formsets"][0].formset
    assert "nginx is a file, so nginx/shop.conf cannot be written" in formset.non_form_errors()[0]
    assert not Template.objects.filter(path="nginx").exists()
    assert new_events(since) == []


def test_the_release_policy_is_set_in_the_admin_as_an_audited_setting(owner_client,
                                                                      environment):
    page = owner_client.get(change_url(ENVIRONMENTS, environment.pk)).content.decode()
    assert 'name="release_policy" value="staged"' in page
    since = last_event_id()

    response = post_change(owner_client, environment,
                           environment_form(environment, release_policy="staged"))

    assert response.status_code == 302, response.context and response.context["errors"]
    environment.refresh_from_db()
    assert (environment.release_policy, environment.version) == ("staged", 2)
    assert [(e.action, e.data) for e in new_events(since)
            if e.action.startswith("environment.")] == [
        ("environment.settings", {"fields": ["release_policy"]})]


def test_an_unknown_release_policy_is_a_form_error(owner_client, environment):
    response = post_change(owner_client, environment,
                           environment_form(environment, release_policy="sometimes"))

    assert response.status_code == 200
    assert "release_policy" in response.context["adminform"].form.errors
    environment.refresh_from_db()
    assert environment.release_policy == "direct"


def test_the_drift_policy_is_set_in_the_admin_as_an_audited_setting_agents_see(
        owner_client, environment, superuser):
    agent = factories.enrolled_agent(environment, "web-1", actor=superuser)
    page = owner_client.get(change_url(ENVIRONMENTS, environment.pk)).content.decode()
    assert 'name="drift_policy" value="restore"' in page
    since = last_event_id()

    response = post_change(owner_client, environment,
                           environment_form(environment, drift_policy="restore"))

    assert response.status_code == 302, response.context and response.context["errors"]
    environment.refresh_from_db()
    assert (environment.drift_policy, environment.version) == ("restore", 2)
    assert [(e.action, e.data) for e in new_events(since)
            if e.action.startswith("environment.")] == [
        ("environment.settings", {"fields": ["drift_policy"]})]
    assert agent.agent.token_key in PollInvalidation.objects.latest("pk").token_keys


def test_an_unknown_drift_policy_is_a_form_error(owner_client, environment):
    response = post_change(owner_client, environment,
                           environment_form(environment, drift_policy="ignore"))

    assert response.status_code == 200
    assert "drift_policy" in response.context["adminform"].form.errors
    environment.refresh_from_db()
    assert (environment.drift_policy, environment.version) == ("report", 1)


def test_saving_a_page_loaded_before_another_change_is_refused(owner_client, environment,
                                                               superuser):
    stale = environment_form(environment, release_policy="staged")
    releases.environment_update(environment=environment, actor=superuser, poll_interval_s=60)

    response = post_change(owner_client, environment, stale)

    assert response.status_code == 200
    assert "changed since you loaded it" in str(
        response.context["adminform"].form.errors["expected_version"])
    environment.refresh_from_db()
    assert (environment.release_policy, environment.poll_interval_s) == ("direct", 60)


@pytest.mark.parametrize(("bad", "word"), [("a\x07b", "#x0007"), ("a\x1bb", "#x001b"),
                                           ("a\ufffeb", "#xfffe"), ("[" * 200, "deep")])
def test_a_config_with_characters_yaml_refuses_is_a_form_error_naming_the_line(
        owner_client, environment, bad, word):
    config_before = environment.config
    since = last_event_id()

    response = post_change(owner_client, environment,
                           environment_form(environment, config=f"listen: 80\nk: {bad}"))

    assert response.status_code == 200
    errors = response.context["adminform"].form.errors["config"]
    assert "config:2:" in errors[0] and word in errors[0], errors
    environment.refresh_from_db()
    assert environment.config == config_before
    assert new_events(since) == []


def test_a_problem_quoting_braces_shows_on_the_change_page(owner_client, environment, superuser):
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    releases.environment_update(environment=environment, actor=superuser,
                                config="x: {a: 1}\n", config_schema=schema)

    response = owner_client.get(change_url(ENVIRONMENTS, environment.pk))

    assert response.status_code == 200
    page = response.content.decode()
    assert "The current config does not render" in page
    assert "{&#x27;a&#x27;: 1}" in page or "{'a': 1}" in page


def test_an_untouched_save_compiles_no_stored_template(owner_client, environment,
                                                       monkeypatch):
    """Templates are checked when they change; a save that leaves them as they are does
    not compile each again (40 large ones took 22-39 s in one request)."""
    from apps.environments import services

    checked = []
    original = services.check_file
    monkeypatch.setattr(services, "check_file",
                        lambda kind, path, *args: checked.append(path) or original(
                            kind, path, *args))
    data = environment_form(environment)
    changed = next(k for k in data if k.endswith("-source"))
    data[changed] = data[changed] + "# changed\n"

    response = post_change(owner_client, environment, data)

    assert response.status_code == 302
    # The changed template only (by the form, then by the service that saves it).
    assert environment.templates.count() > 1
    assert set(checked) == {data[changed.replace("-source", "-path")]}


def test_a_config_that_breaks_the_schema_is_refused_at_save_naming_the_key(
        owner_client, environment, superuser):
    releases.environment_update(
        environment=environment, actor=superuser,
        config_schema={"type": "object", "properties": {
            "workers": {"type": "integer", "minimum": 1}}})
    environment.refresh_from_db()
    config_before, since = environment.config, last_event_id()

    response = post_change(owner_client, environment, environment_form(
        environment, config=environment.config.replace("workers: 4", "workers: many")))

    assert response.status_code == 200
    [error] = response.context["adminform"].form.errors["config"]
    assert error.startswith("Breaks the config schema: workers: 'many' is not of type"), error
    environment.refresh_from_db()
    assert environment.config == config_before and new_events(since) == []


def test_a_new_schema_the_saved_config_breaks_is_refused_with_it(owner_client, environment):
    since = last_event_id()
    schema = '{"type": "object", "required": ["region"]}'
    response = post_change(owner_client, environment,
                           environment_form(environment, config_schema=schema))
    assert response.status_code == 200
    [error] = response.context["adminform"].form.errors["config"]
    assert "'region' is a required property" in error
    environment.refresh_from_db()
    assert environment.config_schema is None and new_events(since) == []


def test_a_config_that_meets_the_schema_saves(owner_client, environment):
    schema = '{"type": "object", "properties": {"workers": {"type": "integer"}}}'
    response = post_change(owner_client, environment, environment_form(
        environment, config_schema=schema,
        config=environment.config.replace("workers: 4", "workers: 5")))
    assert response.status_code == 302, response.context and response.context[
        "adminform"].form.errors
    environment.refresh_from_db()
    assert "workers: 5" in environment.config


def test_the_change_page_has_a_publish_button_that_publishes(
        owner_client, environment, django_capture_on_commit_callbacks):
    page = owner_client.get(change_url(ENVIRONMENTS, environment.pk)).content.decode()
    publish_url = f"{ENVIRONMENTS}{environment.pk}/publish/"
    assert f'action="{publish_url}"' in page and "Publish a snapshot" in page

    with django_capture_on_commit_callbacks(execute=True):
        response = owner_client.post(publish_url, follow=True)

    assert response.redirect_chain[-1][0] == change_url(ENVIRONMENTS, environment.pk)
    snapshot = environment.snapshots.get()
    assert (snapshot.number, snapshot.state) == (1, "ready")
    assert owner_client.get(publish_url).status_code == 405  # a button, not a link


def test_only_who_may_change_the_environment_can_press_publish(
        login, staff_member, staff_outsider, environment):
    publish_url = f"{ENVIRONMENTS}{environment.pk}/publish/"
    for user in (staff_member("deployer"), staff_outsider):
        assert login(user).post(publish_url).status_code in (302, 404)
        assert not environment.snapshots.exists()
    assert login(staff_outsider).post(f"{ENVIRONMENTS}99999/publish/").status_code == 404
