"""Changing environments and their files, and who may see them (real DB)."""

import pytest
from django.contrib.auth.models import AnonymousUser

from apps.audit.models import AuditEvent
from apps.core.errors import NotFound, PermissionDenied, ValidationFailed
from apps.environments.models import Environment, FallbackFile, Template
from apps.environments.selectors import environment_get
from apps.environments.services import (
    environment_file_delete,
    environment_file_put,
)
from apps.releases.services import environment_update
from apps.tenancy.models import Role
from tests.factories import CONFIG, NGINX_TEMPLATE


def fresh(environment) -> Environment:
    return Environment.objects.get(pk=environment.pk)


def events(environment, *, since: int = 0) -> list[tuple[str, dict]]:
    return list(
        AuditEvent.objects.filter(environment=environment, id__gt=since)
        .order_by("id")
        .values_list("action", "data")
    )


def last_event_id() -> int:
    return AuditEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


# --- environment_update ------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "line"),
    [
        ("listen: 80\nserver_name: [unclosed\n", 3),
        ("listen: 80\nworkers: 4\nlisten: 81\n", 3),
        ("listen: 80\n  bad indent: 1\n", 2),
    ],
    ids=["unclosed-flow", "duplicate-key", "bad-indent"],
)
def test_update_refuses_broken_yaml_naming_the_line(environment, superuser, config, line):
    with pytest.raises(ValidationFailed) as excinfo:
        environment_update(environment=environment, actor=superuser, config=config)
    error = excinfo.value
    assert error.code == "config_invalid"
    assert [(d["code"], d["file"], d["line"]) for d in error.details] == [
        ("yaml_syntax", "config", line)
    ]
    assert f"config:{line}" in error.message
    assert fresh(environment).config == CONFIG


@pytest.mark.parametrize(
    ("config", "code"),
    [("- a\n- b\n", "config_not_mapping"), ("1: one\n", "yaml_key_type"),
     ("ratio: .nan\n", "yaml_value_type")],
)
def test_update_refuses_configs_that_are_not_a_mapping_of_json_values(
    environment, superuser, config, code
):
    with pytest.raises(ValidationFailed) as excinfo:
        environment_update(environment=environment, actor=superuser, config=config)
    assert excinfo.value.code == "config_invalid"
    assert [d["code"] for d in excinfo.value.details] == [code]


def test_update_refuses_a_config_over_the_size_limit(environment, superuser, settings):
    settings.BELLWETHER_LIMITS = {**settings.BELLWETHER_LIMITS, "max_config_bytes": 64}
    with pytest.raises(ValidationFailed) as excinfo:
        environment_update(environment=environment, actor=superuser, config="a: " + "x" * 64)
    assert [d["code"] for d in excinfo.value.details] == ["yaml_too_large"]
    assert fresh(environment).config == CONFIG


@pytest.mark.parametrize(
    "change",
    [{"name": "staging"}, {"snapshot_counter": 7}, {"application": None}, {"owners": []}],
    ids=lambda change: next(iter(change)),
)
def test_update_refuses_fields_it_does_not_manage(environment, superuser, change):
    before = last_event_id()
    with pytest.raises(ValidationFailed) as excinfo:
        environment_update(environment=environment, actor=superuser, **change)
    assert next(iter(change)) in excinfo.value.message
    stored = fresh(environment)
    assert (stored.name, stored.snapshot_counter) == ("prod", 0)
    assert events(environment, since=before) == []


@pytest.mark.parametrize("poll_interval_s", [0, 4, 3601, True, "30"])
def test_update_refuses_a_poll_interval_out_of_range(environment, superuser, poll_interval_s):
    with pytest.raises(ValidationFailed):
        environment_update(environment=environment, actor=superuser,
                           poll_interval_s=poll_interval_s)
    assert fresh(environment).poll_interval_s == 30


def test_update_saves_and_audits_only_the_changed_fields(environment, superuser):
    before = last_event_id()
    updated = environment_update(
        environment=environment, actor=superuser,
        config=CONFIG + "extra: true\n", poll_interval_s=30, config_schema=None,
    )
    assert updated.config == CONFIG + "extra: true\n"
    assert fresh(environment).config == CONFIG + "extra: true\n"
    assert events(environment, since=before) == [
        ("environment.update", {"fields": ["config"]})
    ]
    event = AuditEvent.objects.get(id__gt=before)
    assert event.actor == superuser
    assert event.tenant_id == environment.application.tenant_id
    assert "config" in event.summary


def test_update_of_several_fields_audits_inputs_and_settings_apart(environment, superuser):
    before = last_event_id()
    environment_update(environment=environment, actor=superuser, poll_interval_s=60,
                       config_schema={"type": "object"}, release_policy="staged")
    assert sorted(events(environment, since=before)) == [
        ("environment.settings", {"fields": ["poll_interval_s", "release_policy"]}),
        ("environment.update", {"fields": ["config_schema"]}),
    ]
    stored = fresh(environment)
    assert (stored.poll_interval_s, stored.config_schema) == (60, {"type": "object"})


def test_update_without_a_change_is_a_no_op(environment, superuser):
    stamp = fresh(environment).updated_at
    before = last_event_id()
    result = environment_update(environment=environment, actor=superuser, config=CONFIG,
                                poll_interval_s=30, config_schema=None)
    assert result.pk == environment.pk
    assert events(environment, since=before) == []
    assert fresh(environment).updated_at == stamp


# --- environment_file_put / delete -------------------------------------------------


@pytest.mark.parametrize(
    "path",
    ["/etc/nginx/nginx.conf", "../escape.conf", "nginx/../../escape.conf", "nginx\\site.conf",
     "", "nginx//site.conf", "./site.conf", "nginx/", "x" * 256],
)
@pytest.mark.parametrize("kind", ["template", "fallback"])
def test_file_put_refuses_unsafe_paths(environment, superuser, kind, path):
    before = last_event_id()
    with pytest.raises(ValidationFailed) as excinfo:
        environment_file_put(environment=environment, kind=kind, path=path, text="x\n",
                             actor=superuser)
    assert excinfo.value.code == "invalid_path"
    assert excinfo.value.details[0]["file"] == path
    assert not Template.objects.filter(environment=environment, path=path).exists()
    assert not FallbackFile.objects.filter(environment=environment, path=path).exists()
    assert events(environment, since=before) == []


@pytest.mark.parametrize("path", ["nginx/shop.conf/extra.conf", "shop"])
def test_file_put_refuses_a_path_that_collides_with_a_file_or_directory(environment, superuser,
                                                                        path):
    with pytest.raises(ValidationFailed) as excinfo:
        environment_file_put(environment=environment, kind="template", path=path, text="x\n",
                             actor=superuser)
    assert excinfo.value.code == "invalid_path"
    assert not Template.objects.filter(environment=environment, path=path).exists()


@pytest.mark.parametrize("kind", ["template", "fallback"])
def test_file_put_refuses_a_file_over_the_size_limit(environment, superuser, settings, kind):
    settings.BELLWETHER_LIMITS = {**settings.BELLWETHER_LIMITS, "max_file_bytes": 100}
    with pytest.raises(ValidationFailed) as excinfo:
        environment_file_put(environment=environment, kind=kind, path="big.conf",
                             text="é" * 51, actor=superuser)  # 102 bytes, 51 characters
    assert excinfo.value.code == "file_too_large"
    assert "102 bytes" in excinfo.value.message
    assert not Template.objects.filter(path="big.conf").exists()
    assert not FallbackFile.objects.filter(path="big.conf").exists()


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("line 1\nline 2\n{% if %}\n", 3),
        ("ok\n{% for x in xs %}\nno end\n", 2),
        ("ok\nok\nok\n{% endif %}\n", 4),
        ("ok\n{{ value | no_such_filter }}\n", 2),
    ],
    ids=["empty-if", "unclosed-for", "stray-endif", "unknown-filter"],
)
def test_file_put_refuses_template_syntax_errors_naming_the_line(environment, superuser, text,
                                                                  line):
    with pytest.raises(ValidationFailed) as excinfo:
        environment_file_put(environment=environment, kind="template", path="broken.conf",
                             text=text, actor=superuser)
    error = excinfo.value
    assert error.code == "template_syntax"
    assert error.details[0]["file"] == "broken.conf"
    assert error.details[0]["line"] == line
    assert f"broken.conf:{line}" in error.message
    assert not Template.objects.filter(path="broken.conf").exists()


def test_fallback_files_are_literal_not_templates(environment, superuser):
    fallback = environment_file_put(environment=environment, kind="fallback", path="safe.conf",
                                    text="{% if %} is fine here\n", actor=superuser)
    assert fallback.content == "{% if %} is fine here\n"


def test_file_put_updates_in_place_and_audits_create_and_update(environment, superuser):
    before = last_event_id()
    created = environment_file_put(environment=environment, kind="template", path="motd",
                                   text="hello\n", actor=superuser)
    updated = environment_file_put(environment=environment, kind="template", path="motd",
                                   text="hello {{ server_name }}\n", actor=superuser)
    assert updated.pk == created.pk
    assert Template.objects.filter(environment=environment, path="motd").count() == 1
    assert Template.objects.get(pk=created.pk).source == "hello {{ server_name }}\n"
    assert events(environment, since=before) == [
        ("template.create", {"path": "motd"}),
        ("template.update", {"path": "motd"}),
    ]


def test_file_put_of_identical_text_changes_nothing(environment, superuser):
    before = last_event_id()
    entry = environment_file_put(environment=environment, kind="template",
                                 path="nginx/shop.conf", text=NGINX_TEMPLATE, actor=superuser)
    assert entry.source == NGINX_TEMPLATE
    assert events(environment, since=before) == []


def test_file_delete_removes_the_file_and_audits_it(environment, superuser):
    before = last_event_id()
    environment_file_put(environment=environment, kind="fallback", path="safe.conf",
                         text="safe\n", actor=superuser)
    environment_file_delete(environment=environment, kind="fallback", path="safe.conf",
                            actor=superuser)
    environment_file_delete(environment=environment, kind="fallback", path="safe.conf",
                            actor=superuser)  # already gone: nothing to record
    assert not FallbackFile.objects.filter(environment=environment).exists()
    assert events(environment, since=before) == [
        ("fallback.create", {"path": "safe.conf"}),
        ("fallback.delete", {"path": "safe.conf"}),
    ]


def test_templates_and_fallback_files_with_the_same_path_are_separate(environment, superuser):
    environment_file_put(environment=environment, kind="fallback", path="nginx/shop.conf",
                         text="# safe\n", actor=superuser)
    environment_file_delete(environment=environment, kind="fallback", path="nginx/shop.conf",
                            actor=superuser)
    assert Template.objects.get(environment=environment, path="nginx/shop.conf").source == (
        NGINX_TEMPLATE
    )


# --- environment_get ---------------------------------------------------------------


def test_environment_get_finds_a_visible_environment(environment, member):
    viewer = member(Role.VIEWER)
    found = environment_get(user=viewer, application="shop", name="prod")
    assert found.pk == environment.pk


def test_environment_get_hides_an_invisible_environment_as_not_found(environment, outsider):
    with pytest.raises(NotFound):
        environment_get(user=outsider, application="shop", name="prod")


def test_environment_get_of_an_unknown_environment_is_not_found(environment, superuser):
    with pytest.raises(NotFound):
        environment_get(user=superuser, application="shop", name="staging")


@pytest.mark.parametrize(
    ("role", "required", "allowed"),
    [
        (Role.VIEWER, Role.VIEWER, True),
        (Role.VIEWER, Role.DEPLOYER, False),
        (Role.DEPLOYER, Role.DEPLOYER, True),
        (Role.DEPLOYER, Role.OWNER, False),
        (Role.OWNER, Role.OWNER, True),
    ],
)
def test_environment_get_needs_the_required_role(environment, member, role, required,
                                                 allowed):
    user = member(role)
    if allowed:
        assert environment_get(user=user, application="shop", name="prod",
                               required=required) == environment
    else:
        with pytest.raises(PermissionDenied):
            environment_get(user=user, application="shop", name="prod", required=required)


def test_an_environment_owner_holds_the_owner_role_there(environment, member):
    owner = member(Role.VIEWER, "env-owner")  # owners are members (docs/security.md)
    environment.owners.add(owner)
    found = environment_get(user=owner, application="shop", name="prod", required=Role.OWNER)
    assert found == environment


# --- Environment.objects.visible_to ------------------------------------------------


def visible(user) -> list[str]:
    return sorted(e.full_name for e in Environment.objects.visible_to(user))


def test_superuser_sees_every_environment(environment, outsider, superuser):
    assert visible(superuser) == ["blog/prod", "shop/prod"]


def test_member_sees_the_environments_of_their_tenant(environment, outsider, member):
    assert visible(member(Role.VIEWER)) == ["shop/prod"]


def test_outsider_sees_only_their_own_tenant(environment, outsider):
    assert visible(outsider) == ["blog/prod"]


def test_an_owner_who_is_not_a_member_of_the_tenant_sees_nothing(environment, outsider,
                                                                 make_user):
    owner = make_user("env-owner")
    environment.owners.add(owner)  # left behind, e.g. written before the rule
    assert visible(owner) == []


def test_a_member_who_also_owns_the_environment_sees_it_once(environment, member):
    user = member(Role.DEPLOYER)
    environment.owners.add(user)
    assert visible(user) == ["shop/prod"]
    assert Environment.objects.visible_to(user).count() == 1


def test_inactive_user_sees_nothing(environment, member, make_user):
    user = member(Role.OWNER)
    owner = make_user("env-owner")
    environment.owners.add(owner)
    for inactive in (user, owner):
        inactive.is_active = False
        inactive.save(update_fields=["is_active"])
        assert visible(inactive) == []


def test_inactive_superuser_sees_nothing(environment, superuser):
    superuser.is_active = False
    superuser.save(update_fields=["is_active"])
    assert visible(superuser) == []


def test_anonymous_user_sees_nothing(environment, outsider):
    assert visible(AnonymousUser()) == []


def test_user_without_membership_or_ownership_sees_nothing(environment, make_user):
    assert visible(make_user("nobody")) == []


@pytest.mark.parametrize("schema", [
    {"$ref": "#/$defs/nope"},
    {"$ref": "http://127.0.0.1:1/s.json"},
    {"description": "a\u0000b"},
])
def test_saving_a_schema_that_cannot_be_used_is_refused(environment, superuser, schema):
    with pytest.raises(ValidationFailed) as refused:
        environment_update(environment=environment, actor=superuser, config_schema=schema)
    assert refused.value.code == "schema_invalid"
