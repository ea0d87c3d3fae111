"""The admin in a real browser under the Content-Security-Policy: a tenant owner signs
in, filters the environments, opens one and uses its scripted widgets (the owners'
two-list chooser, adding an inline row), with no CSP violation and no script error;
the API docs render their schema too."""

from __future__ import annotations

import re

import pytest

from apps.tenancy.models import Role
from tests.browser.test_dashboard import (
    ACTION_TIMEOUT_MS,
    TEMPLATES,
    VIEWPORT,
    config,
    dashboard_user,
    watch_csp,
)

try:
    from playwright.sync_api import expect
except ImportError:  # the `chromium` fixture skips (fails in CI) and says why
    expect = None

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _signed_in_admin(browser, server, username: str, violations: list, errors: list):
    context = browser.new_context(base_url=server.url, viewport=VIEWPORT)
    context.set_default_timeout(ACTION_TIMEOUT_MS)
    context.on("weberror", lambda error: errors.append(str(error.error)))
    watch_csp(context, violations, errors)
    page = context.new_page()
    page.goto("/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login/"))
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(f"pw-{username}")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(server.url + "/admin/")
    return page


def test_a_tenant_owner_uses_the_admin_with_no_csp_violation(chromium, make_fleet, member):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    owner = dashboard_user(member, Role.OWNER, "owner")
    owner.is_staff = True
    owner.save(update_fields=["is_staff"])
    dashboard_user(member, Role.VIEWER, "viewer")
    environment = fleet.environment
    env_name, env_pk = environment.name, environment.pk
    tenant_id = environment.application.tenant_id  # no ORM once the browser is open
    violations: list[str] = []
    errors: list[str] = []

    with chromium() as browser:
        page = _signed_in_admin(browser, fleet.server, "owner", violations, errors)
        page.goto("/admin/environments/environment/")
        expect(page.locator("#result_list")).to_contain_text(env_name)
        page.goto(f"/admin/environments/environment/?application__tenant__id__exact="
                  f"{tenant_id}&q={env_name}")
        expect(page.locator("#result_list")).to_contain_text(env_name)

        page.goto(f"/admin/environments/environment/{env_pk}/change/")
        # SelectFilter2.js turned the owners' <select multiple> into two lists.
        chooser = page.locator("#id_owners_from")
        expect(chooser).to_be_visible()
        expect(chooser.locator("option", has_text="viewer")).to_have_count(1)
        chooser.select_option(label="viewer")
        page.locator("#id_owners_add").click()
        expect(page.locator("#id_owners_to option")).to_have_text(["viewer"])
        # inlines.js adds a template row.
        rows = page.locator("#templates-group .inline-related:not(.empty-form)")
        before = rows.count()
        page.locator("#templates-group .add-row a").click()
        expect(rows).to_have_count(before + 1)

        docs = page.context.new_page()
        docs.goto("/api/docs/")
        expect(docs.locator(".swagger-ui .info .title")).to_contain_text("Bellwether API")
        assert violations == []
        assert errors == []

        # The watch sees a violation when there is one: an inline script is refused.
        page.evaluate("""() => { const s = document.createElement("script");
                                 s.textContent = "window.__ran = 1";
                                 document.head.appendChild(s); }""")
        page.wait_for_timeout(500)
        assert page.evaluate("window.__ran") is None
    assert violations and all("script-src" in v for v in violations), violations
