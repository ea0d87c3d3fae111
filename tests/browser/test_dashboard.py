"""The dashboard in a real browser: Debian's Chromium, driven by Playwright, against
a real server process (Daphne: HTTP and websockets) on the test database and real
`python -m agent` processes (tests/e2e/harness.py).

Users sign in through the login form. Every change a test waits for on a page
comes from that page: a form post, an htmx swap, or a websocket event after which
a panel refetches itself. "Without a reload" is checked with a marker set on
`window` (a navigation would drop it).

The database is prepared before the browser opens; while it is open the test only
talks HTTP to the server (see tests/browser/conftest.py for why).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth.hashers import PBKDF2PasswordHasher

from apps.environments.services import policy_publish
from apps.releases.services import environment_update
from apps.tenancy.models import Role
from tests.e2e.harness import wait_for, wait_in_sync

try:
    from playwright.sync_api import expect
except ImportError:  # the `chromium` fixture skips (fails in CI) and says why
    expect = None

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

ENV_PATH = "/e/shop/prod/"  # make_fleet's environment
SETTINGS = "app/settings.conf"
TEMPLATES = {SETTINGS: "message = {{ message }}\nworkers = {{ workers }}\n"
                       "channel = {{ params.release_channel | default('stable') }}\n"}
CANARY = "canary-1"
VIEWPORT = {"width": 1280, "height": 900}
ACTION_TIMEOUT_MS = 15_000  # clicks, fills, navigations
AGENT_WAIT_MS = 30_000  # an agent (polling every second) applies and reports
GATE_WAIT_TENTHS = 600  # a held validate command gives up waiting after 60 s

DESCRIPTOR = """apiVersion: bellwether/v1
application: shop
environment: prod
id: rel-2.5.0
version: "2.5.0"
params:
  release_channel: beta
notes: The beta channel for the new checkout.
"""

POLICY = {"descriptor_policy": {"params": ["release_channel"], "secret_refs": []}}

# Installed on a loaded page: the no-reload marker, and a record of the live events
# live.js re-dispatched on <body>, of its state changes (data-live) and of the
# requests htmx made.
WATCH_JS = """() => {
  window.__marker = 1;
  window.__live = [];
  window.__states = [];
  window.__requests = [];
  new MutationObserver(() => window.__states.push(document.body.dataset.live))
    .observe(document.body, {attributes: true, attributeFilter: ["data-live"]});
  for (const kind of ["agent", "deployment", "snapshot", "rollout", "pending", "resync"]) {
    document.body.addEventListener("bw-" + kind, (event) => {
      const detail = event.detail || {};
      window.__live.push({kind: kind, agent: detail.agent ?? null,
                          snapshot: detail.snapshot ?? null, number: detail.number ?? null});
    });
  }
  document.body.addEventListener("htmx:afterRequest", (event) => {
    const info = event.detail.pathInfo || {};
    window.__requests.push(info.finalRequestPath || info.requestPath || "");
  });
}"""


@pytest.fixture
def server_environ(server_environ, request):
    """The e2e harness's server environment: without REDIS_URL, so live events go
    through the in-memory channel layer of the one server process. A test marked
    `redis` gets the suite's Redis instead: the production channel layer
    (channels_redis), and the cache this process empties around each test."""
    if request.node.get_closest_marker("redis") and settings.REDIS_URL:
        server_environ["REDIS_URL"] = settings.REDIS_URL
    return server_environ


def config(message: str, workers: int = 2) -> str:
    return f"message: {message}\nworkers: {workers}\nparams:\n  region: eu\n"


def dashboard_user(member, role: str, username: str):
    """A member of the fleet's tenant who can sign in on the server as `username`
    with the password `pw-<username>`. The suite hashes passwords with MD5 for speed
    (tests/conftest.py), a hasher the server's settings do not accept: store a
    PBKDF2 hash, the server's default."""
    user = member(role, username=username)
    hasher = PBKDF2PasswordHasher()
    user.password = hasher.encode(f"pw-{username}", hasher.salt())
    user.save(update_fields=["password"])
    return user


def held_until(gate: Path, content: str) -> str:
    """A validate command that holds a snapshot whose settings contain `content`
    until `gate` exists, so the test decides when the agent's report reaches the
    server (after the page is loaded and listening). Other content passes at once."""
    return (f"if grep -q {shlex.quote(content)} \"$BELLWETHER_TARGET_DIR/{SETTINGS}\"; then "
            f"i=0; while [ ! -e {shlex.quote(str(gate))} ] && [ $i -lt {GATE_WAIT_TENTHS} ]; "
            "do sleep 0.1; i=$((i+1)); done; fi")


def stage_second_snapshot(fleet, names: list[str], validate: dict | None = None) -> dict:
    """Agents `names` in sync on #1; then the environment requires activation and #2
    (workers = 8) is published but not active: what a rollout stages. Returns the
    agents' ids."""
    assert fleet.api.publish()["number"] == 1
    for name in names:
        extra = ("--validate-command", validate[name]) if validate and name in validate else ()
        fleet.start_agent(name, *extra)
    agents = wait_in_sync(fleet, names, 1)
    environment_update(environment=fleet.environment, release_policy="staged",
                       actor=fleet.actor)
    fleet.change_config(config("hello v2", workers=8))
    assert fleet.api.publish()["number"] == 2
    return {name: agents[name]["id"] for name in names}


def start_rollout_by_api(fleet, canary_id: int) -> dict:
    """Roll #2 out with one canary (manual gates) and wait until the canary has
    acknowledged it; returns the rollout as the API shows it then."""
    created = fleet.api.call("POST", f"{fleet.api.env_path}/rollouts", {
        "snapshot": 2, "canary_agents": [canary_id],
        "waves": [{"percent": 100, "gate": "manual"}],
    }, expect=201)

    def acknowledged():
        body = fleet.api.call("GET", f"/api/v1/rollouts/{created['id']}")
        evidence = body.get("current_wave_evidence") or {}
        return evidence.get("acknowledged") == [CANARY], body

    return wait_for(acknowledged, what=f"{CANARY} to acknowledge #2", diagnostics=fleet.logs)


# Reports every Content-Security-Policy violation of a page to its console (Chromium
# logs most of them there too, as "Refused to ..."); injected by the browser, so the
# policy itself does not apply to it.
CSP_WATCH_JS = """document.addEventListener("securitypolicyviolation", (event) => {
  console.error("CSP violation: " + event.violatedDirective + " " + event.blockedURI);
});"""


def _is_csp(text: str) -> bool:
    return "Content Security Policy" in text or text.startswith("CSP violation")


def watch_csp(context, violations: list[str], errors: list[str]) -> None:
    """Collect every CSP violation of `context`'s pages into `violations`, and every
    other console error into `errors`: what the policy stops without a violation
    event, such as htmx refusing to evaluate code (htmx:evalDisallowedError, with
    allowEval off), is logged there."""
    context.add_init_script(CSP_WATCH_JS)

    def on_console(message):
        if message.type != "error":
            return
        text = message.text
        where = message.page.url if message.page else "?"
        (violations if _is_csp(text) else errors).append(f"{where}: {text}")

    context.on("console", on_console)


def refusal_reports(statuses) -> re.Pattern:
    """The console errors a page logs for an answer it was meant to get refused
    (`statuses`: 400, 409 …): Chromium's "Failed to load resource" line and htmx's
    report of the error response it swapped in."""
    codes = "|".join(str(s) for s in statuses)
    return re.compile(rf": (Failed to load resource: the server responded with a status of "
                      rf"({codes}) |Response Status Error Code ({codes}) from )")


class Dashboard:
    """Signed-in browser contexts on the server (one per user), collecting every
    uncaught script error and every CSP violation of their pages."""

    def __init__(self, browser, server):
        self.browser = browser
        self.server = server
        self.script_errors: list[str] = []
        self.csp_violations: list[str] = []
        self.console_errors: list[str] = []

    def sign_in(self, username: str):
        """A new context signed in through the login form as `username` (see
        dashboard_user); returns its page, on the overview."""
        context = self.browser.new_context(base_url=self.server.url, viewport=VIEWPORT)
        context.set_default_timeout(ACTION_TIMEOUT_MS)
        context.on("weberror", lambda error: self.script_errors.append(
            f"{error.page.url if error.page else '?'}: {error.error}"))
        watch_csp(context, self.csp_violations, self.console_errors)
        page = context.new_page()
        page.goto("/")
        expect(page).to_have_url(re.compile(r"/login/\?next=/$"))
        page.get_by_label("Username").fill(username)
        page.get_by_label("Password").fill(f"pw-{username}")
        page.get_by_role("button", name="Sign in").click()
        expect(page).to_have_url(self.server.url + "/")
        expect(page.locator("header .who")).to_have_text(username)
        return page

    def assert_no_script_errors(self, *, refused=(), refresh_aborted=False) -> None:
        """No uncaught script error, CSP violation or console error; `refused`: the
        statuses of answers the test meant to be refused, whose reports are not
        errors of the page; `refresh_aborted`: a panel's refresh in flight was
        aborted by an action of the panel (hx-sync), which htmx reports."""
        expected = [refusal_reports(refused)] if refused else []
        if refresh_aborted:
            expected.append(re.compile(
                r": htmx:(afterRequest|sendAbort), \[object HTMLDivElement\]$"))
        assert self.script_errors == []
        assert self.csp_violations == []
        unexpected = [e for e in self.console_errors
                      if not any(pattern.search(e) for pattern in expected)]
        assert unexpected == [], self.console_errors


def expect_live(page) -> None:
    """The page's socket is open and the resync it fired on opening has been answered
    (htmx marks an element with a request in flight `htmx-request`): its panels are
    as the server had them then, and no refetch is left to land later."""
    expect(page.locator("body")).to_have_attribute("data-live", "live")
    expect(page.locator("#live-status .live-text")).to_have_text("live")
    expect(page.locator(".htmx-request")).to_have_count(0)


def watch(page) -> None:
    page.evaluate(WATCH_JS)


def assert_not_reloaded(page) -> None:
    assert page.evaluate("window.__marker") == 1, "the page was reloaded or left"


def assert_stayed_live(page) -> list[dict]:
    """Since watch(page): the socket never closed (a reconnect would have changed
    data-live and sent bw-resync, which refetches every panel); returns the live
    events received."""
    live = page.evaluate("window.__live")
    assert page.evaluate("window.__states") == [], "the live socket closed"
    assert all(event["kind"] != "resync" for event in live), live
    return live


def wait_on_page(page, probe, *, what: str, timeout_ms: int = 10_000):
    """Like the harness's wait_for, but waiting inside Playwright, so that its route
    handlers and event listeners run meanwhile (they run only during its calls)."""
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        ok, observed = probe()
        if ok:
            return observed
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out waiting for {what}; last observed: {observed!r}")
        page.wait_for_timeout(100)


def received(live: list[dict], **fields) -> bool:
    return any(all(event.get(key) == value for key, value in fields.items()) for event in live)


def agent_row(page, name: str):
    return page.locator(f'tr[data-agent="{name}"]')


# --- 1. signing in ----------------------------------------------------------------


def test_a_deployer_signs_in_sees_the_environment_and_its_page_goes_live(
        chromium, make_fleet, member, screenshot):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    assert fleet.api.publish()["number"] == 1
    for name in ("web-1", "web-2"):
        fleet.start_agent(name)
    wait_in_sync(fleet, ["web-1", "web-2"], 1)

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        page = dashboard.sign_in("dev")

        row = page.locator('tr[data-environment="shop/prod"]')
        expect(page.locator("tr[data-environment]")).to_have_count(1)
        expect(row.locator(".snap")).to_have_text("#1")
        expect(row.locator(".badge.in_sync")).to_have_text("2 in sync")
        expect(row.locator(".badge.behind")).to_have_text("0 behind")
        expect_live(page)
        screenshot(page, "overview")

        row.get_by_role("link", name="shop/prod").click()
        expect(page).to_have_url(fleet.server.url + ENV_PATH)
        expect(page.locator("h1")).to_have_text("shop/prod")
        expect_live(page)  # body[data-live="live"]: its websocket is open
        for name in ("web-1", "web-2"):
            expect(agent_row(page, name).locator(".applied")).to_have_text("#1")
            expect(agent_row(page, name)).to_have_attribute("data-sync", "in_sync")
        expect(page.locator("#snapshot-1 .badge.active")).to_be_visible()
        dashboard.assert_no_script_errors()

        # The watch sees what htmx refuses to evaluate (allowEval is off): a handler
        # written in hx-on is not run, and htmx reports it on the console only.
        page.evaluate("""() => { const b = document.createElement("button");
                                 b.setAttribute("hx-on:click", "window.__evaluated = 1");
                                 document.body.appendChild(b); htmx.process(b); b.click(); }""")
        page.wait_for_timeout(500)
        assert page.evaluate("window.__evaluated") is None
        assert dashboard.csp_violations == []
    assert any(e.endswith("htmx:evalDisallowedError") for e in dashboard.console_errors), \
        dashboard.console_errors


# --- 2. a descriptor: preview, publish, watch an agent apply it ---------------------


def test_a_published_descriptor_is_previewed_then_applied_and_the_agent_row_updates_live(
        chromium, make_fleet, member, superuser, screenshot):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    policy_publish(content=POLICY, actor=superuser)
    assert fleet.api.publish()["number"] == 1
    gate = fleet.root / "let-web-1-apply"
    fleet.start_agent("web-1", "--validate-command", held_until(gate, "channel = beta"))
    agent_id = wait_in_sync(fleet, ["web-1"], 1)["web-1"]["id"]

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        page = dashboard.sign_in("dev")
        page.goto(ENV_PATH)
        page.get_by_role("link", name="Submit a descriptor").click()
        expect(page.locator("h1")).to_have_text("Submit a descriptor")
        watch(page)

        # Preview: swapped in by htmx, the page stays.
        page.locator("textarea[name=descriptor]").first.fill(DESCRIPTOR)
        page.get_by_role("button", name="Preview").click()
        preview = page.locator("#preview")
        expect(preview.locator("h2")).to_contain_text("renders")
        expect(preview.locator("pre.bw-file")).to_contain_text("release_channel: beta")
        provenance = preview.locator("tr").filter(
            has=page.locator("code", has_text=re.compile(r"^params\.release_channel$")))
        expect(provenance.locator(".badge")).to_have_text("descriptor")
        region = preview.locator("tr").filter(
            has=page.locator("code", has_text=re.compile(r"^params\.region$")))
        expect(region.locator(".badge")).to_have_text("environment")
        expect(preview.locator("h3").filter(has_text="Diff against")).to_have_text(
            "Diff against the active #1")
        expect(preview.locator(".bw-diff .del")).to_contain_text(["channel = stable"])
        expect(preview.locator(".bw-diff .add")).to_contain_text(["channel = beta"])
        assert_not_reloaded(page)
        screenshot(page, "descriptor-preview")

        # Publish: a plain form post, redirected to the environment's page.
        preview.get_by_role("button", name="Publish").click()
        expect(page).to_have_url(fleet.server.url + ENV_PATH)
        expect(page.locator("#flash .msg.success")).to_have_text("Published #2.")
        expect(page.locator("#snapshot-2 .badge.active")).to_be_visible()
        row = agent_row(page, "web-1")
        expect(row.locator(".desired")).to_have_text("#2")
        expect(row.locator(".applied")).to_have_text("#1")  # its validate holds #2

        # From here on the page is not reloaded: the row changes because the agent's
        # report becomes a websocket event and the agents panel refetches itself.
        expect_live(page)
        watch(page)
        gate.touch()
        expect(row.locator(".applied")).to_have_text("#2", timeout=AGENT_WAIT_MS)
        expect(row).to_have_attribute("data-sync", "in_sync")
        expect(row.locator(".message .badge")).to_have_text("succeeded")
        assert_not_reloaded(page)
        live = assert_stayed_live(page)  # no reconnect, no resync, no fallback polling
        assert received(live, kind="deployment", agent=agent_id, snapshot=2), live
        requests = page.evaluate("window.__requests")
        assert any("panel=agents" in path for path in requests), requests

        # The new snapshot's diff.
        page.locator("#snapshot-2").get_by_role("link", name="diff").click()
        result = page.locator("#result")
        expect(result.locator("h2")).to_contain_text("#2 against #1")
        expect(result.locator(".bw-file-head")).to_have_text(
            ["effective config (modified)", f"{SETTINGS} (modified)"])  # params changed too
        expect(result.locator(".bw-diff .add")).to_contain_text(["channel = beta"])
        screenshot(page, "diff")
        dashboard.assert_no_script_errors()

    assert fleet.agents["web-1"].files()[SETTINGS].endswith("channel = beta\n")


def test_the_preview_shows_no_second_copy_of_the_descriptor_above_publish(
        chromium, make_fleet, member, superuser):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    policy_publish(content=POLICY, actor=superuser)
    assert fleet.api.publish()["number"] == 1

    with chromium() as browser:
        page = Dashboard(browser, fleet.server).sign_in("dev")
        page.goto(f"{ENV_PATH}descriptor/")
        page.locator("textarea[name=descriptor]").fill(DESCRIPTOR)
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#preview h2")).to_contain_text("renders")
        expect(page.locator("#preview").get_by_role("button", name="Publish")).to_be_visible()
        # The preview has settled: no need to wait for the copy to hide.
        expect(page.locator("#preview textarea[name=descriptor]")).to_be_hidden(timeout=500)


def test_refused_forms_show_each_error_under_its_field_and_keep_what_was_entered(
        chromium, make_fleet, member, superuser, screenshot):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    policy_publish(content=POLICY, actor=superuser)
    assert fleet.api.publish()["number"] == 1
    # #2 staged, not active: what the rollout form offers (never the active #1).
    environment_update(environment=fleet.environment, release_policy="staged",
                       actor=fleet.actor)
    fleet.change_config(config("hello v2", workers=8))
    assert fleet.api.publish()["number"] == 2
    bad = DESCRIPTOR.replace("id: rel-2.5.0", "id: rel: 2.5.0")

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        page = dashboard.sign_in("dev")

        # The descriptor, through htmx: the form comes back with the error under the
        # textarea and the text in it; the page stays.
        page.goto(f"{ENV_PATH}descriptor/")
        watch(page)
        textarea = page.get_by_label("Descriptor (YAML or JSON)")
        textarea.fill(bad)
        page.get_by_role("button", name="Preview").click()
        error = page.locator("#id_descriptor_error")
        expect(error).to_have_text("descriptor:4: mapping values are not allowed in this context")
        expect(textarea).to_have_value(bad)
        expect(textarea).to_have_attribute("aria-invalid", "true")
        expect(page.locator("#preview h2")).to_have_count(0)
        assert_not_reloaded(page)
        screenshot(page, "descriptor-error")

        # Fixed: the error goes, the preview comes.
        textarea.fill(DESCRIPTOR)
        page.get_by_role("button", name="Preview").click()
        expect(page.locator("#preview h2")).to_contain_text("renders")
        expect(error).to_have_count(0)
        expect(textarea).to_have_value(DESCRIPTOR)
        assert_not_reloaded(page)

        # The rollout form, posted plainly: every field keeps its value, each error
        # is under its field.
        page.goto(f"{ENV_PATH}rollouts/new/")
        page.get_by_label("Waves after the canaries").fill("25, 0")
        page.get_by_label("Gate between waves").select_option("auto")
        page.get_by_role("button", name="Start the rollout").click()
        expect(page.locator("#id_waves_error")).to_have_text(
            "percentages from 1 to 100, separated by commas.")
        expect(page.locator("#id_canary_error")).to_have_text(
            "Name the canaries: pick at least one agent.")
        expect(page.get_by_label("Waves after the canaries")).to_have_value("25, 0")
        expect(page.get_by_label("Gate between waves")).to_have_value("auto")
        expect(page.get_by_label("Snapshot")).to_have_value("2")
        screenshot(page, "rollout-error")
        dashboard.assert_no_script_errors(refused=[400])


# --- 3. a canary rollout: start, acknowledge, confirm, roll back --------------------


def test_a_canary_rollout_is_started_confirmed_and_rolled_back_from_the_page(
        chromium, make_fleet, member, screenshot):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    names = [CANARY, "web-2", "web-3"]
    # Each agent applies #2 only when the test lets it: one report at a time, after
    # the page is listening (two reports at once can be lost on the page: see
    # test_a_report_arriving_while_the_agents_panel_refetches_shows_up).
    gates = {name: fleet.root / f"let-{name}-apply" for name in names}
    stage_second_snapshot(fleet, names, validate={
        name: held_until(gate, "workers = 8") for name, gate in gates.items()})

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        page = dashboard.sign_in("dev")
        page.goto(ENV_PATH)
        rollout = page.locator("#rollout")
        expect(rollout).to_contain_text("No rollout yet.")

        page.get_by_role("link", name="Start a rollout").click()
        expect(page.locator("h1")).to_have_text("Start a rollout")
        page.get_by_label("Snapshot").select_option("2")
        page.get_by_label(CANARY).check()
        page.get_by_label("Waves after the canaries").fill("100")
        page.get_by_label("Gate between waves").select_option("manual")
        screenshot(page, "rollout")
        page.get_by_role("button", name="Start the rollout").click()

        expect(page).to_have_url(fleet.server.url + ENV_PATH)
        expect(page.locator("#flash .msg.success")).to_contain_text(
            "of #2 started: the canaries have it now.")
        expect(rollout.locator(".badge").first).to_have_text("Running")
        expect(rollout).to_contain_text("at the canaries")
        acknowledged = rollout.locator("dd.ack")
        expect(acknowledged).to_have_text("nobody yet")
        expect(agent_row(page, CANARY).locator(".desired")).to_have_text("#2")

        # The canary's report arrives while the page is open: it shows up live.
        expect_live(page)
        watch(page)
        gates[CANARY].touch()
        expect(acknowledged).to_have_text(CANARY, timeout=AGENT_WAIT_MS)
        expect(agent_row(page, CANARY).locator(".applied")).to_have_text("#2")
        for name in ("web-2", "web-3"):
            expect(agent_row(page, name).locator(".applied")).to_have_text("#1")
        assert_not_reloaded(page)
        screenshot(page, "environment")

        # Confirm: the next wave gets #2; its agents acknowledge it, live.
        rollout.get_by_role("button", name="Confirm the canaries").click()
        expect(page.locator("#flash .msg.success")).to_contain_text(
            "confirmed: wave 1 has it now")
        expect(rollout).to_contain_text("at wave 1")
        expect(acknowledged).to_have_text("nobody yet")
        for name in ("web-2", "web-3"):
            expect(agent_row(page, name).locator(".desired")).to_have_text("#2")
        for name, shown in (("web-2", "web-2"), ("web-3", "web-2, web-3")):
            gates[name].touch()
            expect(agent_row(page, name).locator(".applied")).to_have_text(
                "#2", timeout=AGENT_WAIT_MS)
            expect(acknowledged).to_have_text(shown)
        expect(rollout.get_by_role("button", name="Confirm wave 1")).to_be_visible()

        # Roll back, accepting the confirmation dialog: #1's content comes back as #3.
        dialogs = []

        def accept(dialog):
            dialogs.append(dialog.message)
            dialog.accept()

        page.on("dialog", accept)
        rollout.get_by_role("button", name="Roll back").click()
        expect(rollout.locator(".badge.rolled_back")).to_have_text("Rolled back")
        expect(rollout).to_contain_text("rolled back as #3")
        expect(rollout).to_contain_text("(rolled back from the dashboard)")
        expect(rollout.get_by_role("button")).to_have_count(0)
        # The live panel can show the rollback before the POST that rendered #3 answers.
        expect(page.locator("#flash .msg.success")).to_contain_text(
            "rolled back.", timeout=AGENT_WAIT_MS)
        assert len(dialogs) == 1 and dialogs[0].startswith("Roll back rollout"), dialogs
        expect(page.locator("#snapshot-3")).to_contain_text("rollback to #1")
        expect(page.locator("#snapshot-3 .badge.active")).to_be_visible()
        assert_not_reloaded(page)
        assert_stayed_live(page)

        # Every agent follows #3 (all at once: checked after a reload).
        wait_in_sync(fleet, names, 3)
        page.reload()
        for name in names:
            expect(agent_row(page, name).locator(".applied")).to_have_text("#3")
        # A confirm or rollback posted while the panel's live refresh is in flight
        # aborts that refresh (hx-sync): htmx reports it, nothing is wrong.
        dashboard.assert_no_script_errors(refresh_aborted=True)

    first = fleet.api.snapshot_files(1)
    for name in names:
        assert fleet.agents[name].files() == first


# --- 4. a stale confirm -----------------------------------------------------------


def withhold_server_messages(route) -> None:
    """A page's /ws/live/ socket, connected to the real server, but nothing the
    server sends is passed on but its pongs: the page stays "live" (a ping left
    unanswered would make it reconnect and refetch every panel) and never hears
    of a change."""
    server = route.connect_to_server()

    def pongs_only(message) -> None:
        if isinstance(message, str) and json.loads(message).get("kind") == "pong":
            route.send(message)
    server.on_message(pongs_only)


def test_confirming_a_rollout_that_changed_since_the_page_loaded_says_so_and_does_nothing(
        chromium, make_fleet, member):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    ids = stage_second_snapshot(fleet, [CANARY, "web-2"])
    rollout_id = start_rollout_by_api(fleet, ids[CANARY])["id"]
    before = fleet.api.call("GET", f"/api/v1/rollouts/{rollout_id}")
    assert (before["state"], before["current_wave"]) == ("running", 0)

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        page = dashboard.sign_in("dev")
        # A second tab of the same session. Left alone, its rollout panel would
        # refetch itself on the live event of the first tab's confirm, and a click
        # would only ever see the current version. To be stale for sure it hears
        # nothing: its websocket is routed through Playwright, connected to the
        # server, with every message from the server dropped. Its socket stays open,
        # so live.js never falls back to polling (which would also refresh it).
        stale = page.context.new_page()
        stale.route_web_socket(re.compile(r"/ws/live/$"), withhold_server_messages)
        for tab in (page, stale):
            tab.goto(ENV_PATH)
            expect_live(tab)
            expect(tab.locator("#rollout")).to_contain_text("at the canaries")
            expect(tab.locator("#rollout dd.ack")).to_have_text(CANARY)
        watch(stale)

        page.locator("#rollout").get_by_role("button", name="Confirm the canaries").click()
        expect(page.locator("#flash .msg.success")).to_contain_text(
            "confirmed: wave 1 has it now")
        expect(page.locator("#rollout")).to_contain_text("at wave 1")
        expect(stale.locator("#rollout")).to_contain_text("at the canaries")  # still stale

        # Every panel refreshes as the click posts (a resync, or their minute's
        # refresh landing then): the action aborts a refresh in flight, a later one
        # waits for the action's answer, which is the panel and the flash (the form
        # it came from still in the page).
        with stale.expect_response(re.compile(r"/confirm/$")) as answer:
            stale.evaluate("""() => {
                const confirm = [...document.querySelectorAll("#rollout button")].find(
                    (button) => button.textContent.includes("Confirm the canaries"));
                confirm.click();
                htmx.trigger(document.body, "bw-resync");
            }""")
        assert answer.value.status == 409, answer.value.status
        flash = stale.locator("#flash .msg")
        expect(flash).to_have_count(1)
        expect(flash).to_have_class(re.compile(r"\berror\b"))
        expect(flash).to_contain_text(f"Rollout {rollout_id} changed since you loaded it")
        expect(flash).to_contain_text("Nothing was done")
        # The refused action's answer is the current panel.
        expect(stale.locator("#rollout")).to_contain_text("at wave 1")
        expect(stale.locator("#rollout").get_by_role("button", name="Confirm wave 1")
               ).to_be_visible()
        assert_not_reloaded(stale)
        dashboard.assert_no_script_errors(refused=[409], refresh_aborted=True)

    after = fleet.api.call("GET", f"/api/v1/rollouts/{rollout_id}")
    assert (after["state"], after["current_wave"], after["version"]) == (
        "running", 1, before["version"] + 1), after


# --- 5. a viewer --------------------------------------------------------------------


def test_a_viewer_sees_the_rollout_and_agents_but_no_deploy_or_confirm_buttons(
        chromium, make_fleet, member):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    dashboard_user(member, Role.VIEWER, "viewer")
    ids = stage_second_snapshot(fleet, [CANARY, "web-2"])
    start_rollout_by_api(fleet, ids[CANARY])
    # (No deploy buttons for anyone here: the rollout holds every agent.)
    actions = ["Confirm the canaries", "Roll back"]
    links = ["Submit a descriptor", "Start a rollout"]

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        # What a deployer gets on this page, so the viewer's page is compared with
        # buttons that are really there.
        deployer = dashboard.sign_in("dev")
        deployer.goto(ENV_PATH)
        expect(deployer.locator("#rollout dd.ack")).to_have_text(CANARY)
        for name in actions:
            expect(deployer.get_by_role("button", name=name, exact=True).first).to_be_visible()
        for name in links:
            expect(deployer.get_by_role("link", name=name).first).to_be_visible()

        page = dashboard.sign_in("viewer")
        page.goto(ENV_PATH)
        expect_live(page)
        expect(page.locator("#rollout")).to_contain_text("at the canaries")
        expect(page.locator("#rollout dd.ack")).to_have_text(CANARY)
        expect(page.locator("tr[data-agent]")).to_have_count(2)
        expect(page.locator("#snapshot-2")).to_be_visible()
        # Signing out is the only thing to press, and the only form that posts.
        expect(page.get_by_role("button")).to_have_text(["Sign out"])
        expect(page.locator("form[method=post]")).to_have_count(1)
        for name in links:
            expect(page.get_by_role("link", name=name)).to_have_count(0)
        expect(page.get_by_role("link", name="Compare snapshots")).to_be_visible()
        dashboard.assert_no_script_errors()


# --- the production channel layer ---------------------------------------------------

IDLE_MS = 8_000  # longer than several blocking receives (REDIS_TIMEOUT_S / 2) and a reconnect


@pytest.mark.redis
def test_an_idle_page_keeps_its_live_socket_on_the_redis_channel_layer(
        chromium, make_fleet, member):
    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    assert fleet.api.publish()["number"] == 1
    fleet.change_config(config("hello v2"))  # published once the page has been idle

    with chromium() as browser:
        dashboard = Dashboard(browser, fleet.server)
        page = dashboard.sign_in("dev")
        page.goto(ENV_PATH)
        expect_live(page)
        watch(page)
        page.wait_for_timeout(IDLE_MS)  # nothing happens meanwhile

        assert fleet.api.publish()["number"] == 2
        expect(page.locator("#snapshot-2 .badge.active")).to_be_visible()
        # The panels may refresh on the publication's own events first: the snapshot's
        # event may come a moment later (polled from here: the page's CSP forbids the
        # eval that wait_for_function's polling needs).
        for _ in range(50):
            if received(page.evaluate("window.__live") or [], kind="snapshot", number=2):
                break
            page.wait_for_timeout(200)
        assert_not_reloaded(page)
        live = assert_stayed_live(page)
        assert received(live, kind="snapshot", number=2), live
        dashboard.assert_no_script_errors()


# --- two reports close together -------------------------------------------------------


def test_a_report_arriving_while_the_agents_panel_refetches_shows_up(
        chromium, make_fleet, member):
    from playwright.sync_api import Error as PlaywrightError

    fleet = make_fleet(config("hello v1"), TEMPLATES)
    dashboard_user(member, Role.DEPLOYER, "dev")
    gates = {name: fleet.root / f"let-{name}-apply" for name in ("web-1", "web-2")}
    assert fleet.api.publish()["number"] == 1
    for name, gate in gates.items():
        fleet.start_agent(name, "--validate-command", held_until(gate, "workers = 8"))
    ids = {name: agent["id"] for name, agent in wait_in_sync(fleet, list(gates), 1).items()}
    fleet.change_config(config("hello v2", workers=8))  # published with the page open

    with chromium() as browser:
        page = Dashboard(browser, fleet.server).sign_in("dev")
        # The first agents-panel refetch once armed is answered by the server at once,
        # but its answer reaches the page only when the test says so: that refetch
        # is "in flight" for as long as the test needs.
        held, armed = [], []

        def hold_first(route):
            if armed and not held:
                held.append((route, route.fetch()))
            else:
                route.continue_()

        page.route(re.compile(r"\?panel=agents$"), hold_first)
        page.goto(ENV_PATH)
        expect_live(page)
        assert fleet.api.publish()["number"] == 2  # active: both agents apply it, held
        for name in gates:
            expect(agent_row(page, name).locator(".desired")).to_have_text("#2")
        page.wait_for_timeout(1_000)  # the refetches the publication caused are done
        watch(page)

        armed.append(True)
        gates["web-1"].touch()  # web-1 reports; the refetch it causes is held
        wait_on_page(page, lambda: (bool(held), len(held)),
                     what="the refetch after web-1's report")
        gates["web-2"].touch()  # web-2 reports while that refetch is in flight

        def web_2_event_seen():
            live = page.evaluate("window.__live")
            return received(live, kind="deployment", agent=ids["web-2"], snapshot=2), live

        wait_on_page(page, web_2_event_seen, what="web-2's report to reach the page",
                     timeout_ms=AGENT_WAIT_MS)
        page.wait_for_timeout(1_000)  # its refetch (delay:300ms) waits behind the held one
        route, response = held[0]
        with contextlib.suppress(PlaywrightError):  # a fix may have aborted it
            route.fulfill(response=response)

        expect(agent_row(page, "web-1").locator(".applied")).to_have_text(
            "#2", timeout=AGENT_WAIT_MS)
        # Its refetch follows the held one at once: no need to wait for longer.
        expect(agent_row(page, "web-2").locator(".applied")).to_have_text("#2", timeout=3_000)
        assert_not_reloaded(page)
        assert_stayed_live(page)
