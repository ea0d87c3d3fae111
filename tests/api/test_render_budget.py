"""A template that goes over the render budget: every route that renders answers
`400 render_limit` naming the template and line (publish: the publication ends
invalid with that reason), quickly, never a 5xx; renders in web requests are
capped per process (503 render_busy at once)."""

import functools
import json
import time

import pytest

from apps.environments.services import environment_file_put
from apps.snapshots import selectors
from apps.snapshots.models import Publication, Snapshot
from tests import factories
from tests.admin.support import ENVIRONMENTS, change_url
from tests.api.support import ENV
from tests.api_helpers import assert_error
from tests.render_children import c_level_hang

transactional = pytest.mark.django_db(transaction=True)

HOSTILE = {
    "center": "{{ 'x'|center(2**40) }}",
    "fan-out": "{% macro m(n) %}{% if n %}{{ m(n - 1) }}{{ m(n - 1) }}{% endif %}"
               "{% endmacro %}{{ m(40) }}",
    "replace": "{{ ('a' * 100000)|replace('a', 'b' * 1000) }}",
    "format": "{{ '%*s'|format(1000000000, 'x') }}",
    "concat": "{% set ns = namespace(s='x') %}{% for i in range(40) %}"
              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
}
WALL = 8.0


def _plant(environment, actor, template: str, path: str = "shop/zz.conf"):
    environment_file_put(environment=environment, kind="template", path=path,
                         text="line one\n" + template + "\n", actor=actor)
    return path


def _refusal(response, path="shop/zz.conf") -> dict:
    error = assert_error(response, 400, "render_limit")
    assert error["details"][0]["file"] == path
    assert error["details"][0]["line"] == 2
    assert f"{path}:2" in error["message"]
    return error


@pytest.mark.parametrize("template", HOSTILE.values(), ids=HOSTILE.keys())
def test_preview_answers_render_limit_quickly(template, environment, superuser, client_for):
    _plant(environment, superuser, template)
    started = time.monotonic()
    response = client_for("viewer").get(f"{ENV}/preview")
    assert time.monotonic() - started < WALL
    _refusal(response)


def test_asking_again_for_a_limited_render_costs_nothing(environment, superuser, client_for):
    _plant(environment, superuser, HOSTILE["fan-out"])
    client = client_for("viewer")
    _refusal(client.get(f"{ENV}/preview"))
    started = time.monotonic()
    for _ in range(10):
        _refusal(client.get(f"{ENV}/preview"))
    assert time.monotonic() - started < 4  # ten renders would take 20 s


def test_preview_of_an_ordinary_template_still_renders(environment, superuser, client_for):
    _plant(environment, superuser, "{{ 'x'|center(5) }}|{{ '%3d' % 7 }}")
    response = client_for("viewer").get(f"{ENV}/preview")
    assert response.status_code == 200
    files = {f["path"]: f["content"] for f in response.json()["files"]}
    assert files["shop/zz.conf"] == "line one\n  x  |  7\n"


@pytest.mark.parametrize("template", list(HOSTILE.values())[:2], ids=list(HOSTILE)[:2])
def test_pending_answers_render_limit(template, environment, superuser, client_for):
    _plant(environment, superuser, template)
    started = time.monotonic()
    response = client_for("viewer").get(f"{ENV}/pending")
    assert time.monotonic() - started < WALL
    _refusal(response)


def test_a_descriptor_dry_run_answers_render_limit(environment, superuser, client_for):
    from tests.api.test_descriptors import descriptor

    _plant(environment, superuser, HOSTILE["center"])
    before = Publication.objects.count()
    response = client_for("deployer").post("/api/v1/descriptors?dry_run=1",
                                           descriptor(params={}, secrets={}), format="json")
    _refusal(response)
    assert Publication.objects.count() == before


@transactional
def test_a_publish_over_the_budget_ends_invalid_naming_template_and_line(
        environment, superuser, client_for):
    _plant(environment, superuser, HOSTILE["fan-out"])
    started = time.monotonic()
    response = client_for("deployer").post(f"{ENV}/publish")
    assert time.monotonic() - started < 15
    error = assert_error(response, 400, "snapshot_invalid")
    [problem] = [e for e in error["details"] if e["code"] == "render_limit"]
    assert (problem["file"], problem["line"]) == ("shop/zz.conf", 2)
    assert "shop/zz.conf:2" in error["message"]
    publication = Publication.objects.get()
    assert publication.state == Publication.State.INVALID
    snapshot = Snapshot.objects.get()
    assert snapshot.state == Snapshot.State.INVALID
    assert snapshot.report["errors"][0]["code"] == "render_limit"


def test_the_admin_change_page_shows_the_render_limit(environment, superuser, client):
    _plant(environment, superuser, HOSTILE["center"])
    client.force_login(superuser)
    started = time.monotonic()
    response = client.get(change_url(ENVIRONMENTS, environment.pk))
    assert time.monotonic() - started < WALL
    assert response.status_code == 200
    page = response.content.decode()
    assert "The current config does not render" in page
    assert "shop/zz.conf 2" in page


def test_the_dashboard_pages_stay_up(environment, superuser, client):
    from tests.api.test_descriptors import descriptor

    _plant(environment, superuser, HOSTILE["fan-out"])
    client.force_login(superuser)
    assert client.get("/e/shop/prod/").status_code == 200
    text = json.dumps(descriptor(params={}, secrets={}))
    response = client.post("/e/shop/prod/descriptor/", {"descriptor": text, "step": "preview"})
    assert response.status_code == 400
    assert "shop/zz.conf:2" in response.content.decode()


def test_web_renders_beyond_the_cap_answer_503_at_once(environment, client_for, settings):
    settings.BELLWETHER_WEB_RENDERS = 1
    slots = selectors._web_slots(environment.application.tenant_id)
    client = client_for("viewer")
    assert slots.acquire(timeout=1)
    try:
        started = time.monotonic()
        response = client.get(f"{ENV}/preview")
        assert time.monotonic() - started < 2
    finally:
        slots.release()
    assert_error(response, 503, "render_busy")
    assert response["Retry-After"] == "2"
    assert client.get(f"{ENV}/preview").status_code == 200


MISUSE = {"truncate": "{{ 'x'|truncate(2) }}",
          "truncate leeway": "{{ 'abcdef'|truncate(3, leeway=-5) }}",
          "inf": "{{ 1e999|int }}", "none arithmetic": "{{ none + 1 }}", "zero": "{{ 1 // 0 }}"}


@pytest.mark.parametrize("template", MISUSE.values(), ids=MISUSE.keys())
def test_a_misused_builtin_is_a_template_error_on_every_web_render(
        template, environment, superuser, client_for, client):
    _plant(environment, superuser, template)
    viewer = client_for("viewer")
    for route in ("preview", "pending"):
        response = viewer.get(f"{ENV}/{route}")
        assert response.status_code == 200, response.content
        [problem] = response.json()["errors"]
        assert (problem["code"], problem["file"], problem["line"]) == \
            ("template_error", "shop/zz.conf", 2)
    client.force_login(superuser)
    assert client.get("/e/shop/prod/").status_code == 200
    assert client.get(change_url(ENVIRONMENTS, environment.pk)).status_code == 200


@transactional
def test_a_publish_with_a_misused_builtin_is_invalid_naming_file_and_line(
        environment, superuser, client_for):
    _plant(environment, superuser, MISUSE["truncate"])
    error = assert_error(client_for("deployer").post(f"{ENV}/publish"), 400, "snapshot_invalid")
    [problem] = error["details"]
    assert (problem["code"], problem["file"], problem["line"]) == \
        ("template_error", "shop/zz.conf", 2)
    assert "AssertionError" in problem["message"]
    assert "internal error" not in error["message"]


NESTED = {"parentheses": "{{ " + "(" * 100 + "1" + ")" * 100 + " }}",
          "brackets": "{{ " + "[" * 100 + "1" + "]" * 100 + " }}",
          "not": "{{ " + "not " * 3000 + "1 }}", "minus": "{{ " + "-" * 3000 + "1 }}",
          "plus chain": "{{ 1" + " + 1" * 3000 + " }}"}


@pytest.mark.parametrize("template", NESTED.values(), ids=NESTED.keys())
def test_a_deeply_nested_template_put_answers_template_syntax(template, environment, client_for):
    response = client_for("owner").put(f"{ENV}/templates/shop/deep.conf",
                                       {"source": "line one\n" + template}, format="json")
    error = assert_error(response, 400, "template_syntax")
    assert (error["details"][0]["file"], error["details"][0]["line"]) == ("shop/deep.conf", 2)


def test_a_nested_template_within_the_limits_is_stored(environment, client_for):
    response = client_for("owner").put(f"{ENV}/templates/shop/deep.conf",
                                       {"source": "{{ " + "(" * 20 + "1" + ")" * 20 + " }}"},
                                       format="json")
    assert response.status_code == 200


@pytest.mark.processes
@pytest.mark.serial
def test_a_web_render_runs_isolated_so_c_level_work_cannot_hold_the_server(
        environment, superuser, client_for, settings, monkeypatch):
    settings.BELLWETHER_RENDER_ISOLATED = True
    settings.BELLWETHER_WEB_RENDER_SECONDS = 1
    monkeypatch.setattr(selectors, "render_isolated",
                        functools.partial(selectors.render_isolated, render=c_level_hang))
    viewer = client_for("viewer")
    started = time.monotonic()
    response = viewer.get(f"{ENV}/preview")
    assert time.monotonic() - started < 5
    error = assert_error(response, 503, "render_timeout")
    assert "stopped" in error["message"] and int(response["Retry-After"]) >= 1
    # The server's load decided that outcome, not the template: it is not remembered.
    monkeypatch.undo()
    assert viewer.get(f"{ENV}/preview").status_code == 200


@pytest.mark.slow
def test_a_render_over_its_deadline_is_not_remembered(environment, superuser, client_for,
                                                       settings):
    settings.BELLWETHER_WEB_RENDER_SECONDS = 1
    _plant(environment, superuser, "{% for i in range(100000) %}{% for j in range(100000) %}"
                                   "{% endfor %}{% endfor %}")
    settings.BELLWETHER_LIMITS = {**settings.BELLWETHER_LIMITS,
                                  "max_template_iterations": 10**12}
    environment.refresh_from_db()
    response = client_for("viewer").get(f"{ENV}/preview")
    error = assert_error(response, 503, "render_timeout")
    assert "longer than 1 seconds" in error["message"] and response["Retry-After"] == "5"
    assert error["details"][0]["file"] == "shop/zz.conf" and error["details"][0]["line"] == 2
    assert selectors._cached_limit(selectors._source_key(
        selectors.render_source_for(environment))) is None


def test_a_tenant_using_all_its_render_slots_does_not_refuse_another_tenant(
        environment, client_for, settings, tenant, superuser):
    other_tenant = factories.tenant(actor=superuser, name="Other team", slug="other-team")
    other = factories.environment(factories.application(other_tenant, actor=superuser,
                                                        name="web"),
                                  templates=factories.SHOP_TEMPLATES, actor=superuser)
    settings.BELLWETHER_WEB_RENDERS = 1
    held = selectors._web_slots(tenant.pk)
    assert held.acquire(timeout=1)
    try:
        assert_error(client_for("viewer").get(f"{ENV}/preview"), 503, "render_busy")
        assert selectors.snapshot_preview(other).is_valid
    finally:
        held.release()


def test_the_safety_cap_over_all_tenants_answers_render_busy(environment, client_for,
                                                             settings):
    settings.BELLWETHER_WEB_RENDERS_TOTAL = 1
    every = selectors._web_slots()
    assert every.acquire(timeout=1)
    viewer = client_for("viewer")
    try:
        assert_error(viewer.get(f"{ENV}/preview"), 503, "render_busy")
    finally:
        every.release()
    assert viewer.get(f"{ENV}/preview").status_code == 200


@transactional
def test_threads_hammering_web_renders_with_the_database_busy_all_answer(environment,
                                                                         settings):
    """Server threads preview while others use the database (SQLite's or
    PostgreSQL's locks held at any moment): every render answers, none is stopped."""
    import threading

    from django.db import connection

    from apps.environments.models import Environment

    settings.BELLWETHER_WEB_RENDERS = 8
    outcomes, previewing = [], threading.Event()

    def previews():
        try:
            for _ in range(5):
                env = Environment.objects.select_related("application").get(pk=environment.pk)
                outcomes.append(selectors.snapshot_preview(env).problems)
        finally:
            connection.close()

    def queries():
        try:
            while previewing.is_set():
                list(Environment.objects.all())
        finally:
            connection.close()

    previewing.set()
    renderers = [threading.Thread(target=previews) for _ in range(3)]
    others = [threading.Thread(target=queries) for _ in range(2)]
    for thread in renderers + others:
        thread.start()
    for thread in renderers:
        thread.join()
    previewing.clear()
    for thread in others:
        thread.join()
    assert outcomes == [[]] * 15  # every render answered, none stopped or refused


TOO_MANY_TOKENS = {"variables": "{{a}}" * 200_000, "tags": "{% if a %}x{% endif %}" * 3000,
                   "loops": "{% for i in x %}{{ i.b|e }}{% endfor %}" * 1000}


@pytest.mark.parametrize("source", TOO_MANY_TOKENS.values(), ids=TOO_MANY_TOKENS.keys())
def test_a_template_too_large_to_compile_is_refused_at_save_quickly(source, environment,
                                                                    client_for):
    started = time.monotonic()
    response = client_for("owner").put(f"{ENV}/templates/big.txt", {"source": source},
                                       format="json")
    assert time.monotonic() - started < 1.5
    error = assert_error(response, 400, "template_syntax")
    assert error["details"][0]["file"] == "big.txt"
    assert "10000 tokens" in error["message"]
    assert not environment.templates.filter(path="big.txt").exists()


def test_a_template_within_the_token_limit_is_stored_and_previews_in_time(
        environment, client_for):
    source = "{% if a %}x{% endif %}" * 1200  # about 9,600 tokens
    response = client_for("owner").put(f"{ENV}/templates/big.txt", {"source": source},
                                       format="json")
    assert response.status_code == 200, response.content
    started = time.monotonic()
    assert client_for("viewer").get(f"{ENV}/preview").status_code == 200
    assert time.monotonic() - started < 1.5
