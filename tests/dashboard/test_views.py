"""The htmx dashboard's pages and actions through Django's test client: sign-in,
scoping, the named partials htmx asks for, role-aware buttons backed by the server's
own refusals, CSRF, and every action calling the same services as the API.

Agents, snapshots, reports and rollouts are made by the real services (enrollment,
releases.snapshot_publish, report_intake, rollout_create) through tests/factories.py.
A render queued by a publish runs on commit, which never comes inside the default
test transaction: tests that need the finished snapshot use transaction=True.
"""

import json
import re
from html import unescape
from urllib.parse import quote

import pytest
import yaml
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from apps.audit.models import AuditEvent
from apps.environments.models import Descriptor, Environment
from apps.environments.services import environment_create, environment_file_put, policy_publish
from apps.fleet import services as fleet_services
from apps.fleet.models import Agent, Deployment
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.rollouts import services as rollout_services
from apps.rollouts.models import Rollout, RolloutTarget
from apps.snapshots.models import Publication, Snapshot
from tests.factories import (
    CONFIG,
    ack,
    enrolled_agents,
    poll,
    publish,
    publish_variant,
    session_client,
    staged_environment,
    start_rollout,
)

# Heartbeats and poll states live in the cache: every test starts and ends with it empty.
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_cache")]
transactional = pytest.mark.django_db(transaction=True)

HTMX = {"HX-Request": "true"}
# After the canaries, one manual wave with every other agent.
MANUAL_WAVES = [{"percent": 100, "gate": "manual"}]


# --- helpers ---------------------------------------------------------------------------


def url(name: str, *args, env: tuple[str, str] = ("shop", "prod")) -> str:
    return reverse(f"dashboard:{name}", args=[*env, *args])


def text(response) -> str:
    return response.content.decode()


def section(html: str, section_id: str) -> str:
    """The <section id=...> element (sections are never nested)."""
    found = re.search(rf'<section id="{section_id}".*?</section>', html, re.S)
    assert found, f"no section #{section_id} in {html[:500]}"
    return found.group(0)


def agent_row(html: str, agent: Agent) -> str:
    found = re.search(rf'<tr id="agent-{agent.pk}".*?</tr>', html, re.S)
    assert found, f"no row for {agent.name}"
    return found.group(0)


def flash(html: str) -> str:
    found = re.search(r'<div id="flash".*?</div>', html, re.S)
    assert found, "no #flash"
    return found.group(0)


def is_partial(html: str, section_id: str) -> bool:
    """The answer is just that section: no page around it."""
    return (html.lstrip().startswith(f'<section id="{section_id}"')
            and "<html" not in html and "<body" not in html)


def stored() -> dict:
    """Every row count an action of the dashboard could change."""
    return {model.__name__: model.objects.count() for model in (
        Deployment, Publication, Snapshot, Descriptor, Rollout, AuditEvent)}


def rollout_state(rollout: Rollout) -> tuple:
    current = Rollout.objects.get(pk=rollout.pk)
    return current.state, current.version, current.current_wave


def field_errors(html: str, field: str) -> list[str]:
    """The errors shown under a form's field (Django's error list, which the field
    names with aria-describedby and marks with aria-invalid)."""
    found = re.search(rf'<ul class="errorlist" id="id_{field}_error">(.*?)</ul>', html, re.S)
    if not found:
        return []
    assert re.search(rf'<[^>]* name="{field}"[^>]*aria-invalid="true"[^>]*>', html) or (
        re.search(rf'<[^>]*aria-invalid="true"[^>]* name="{field}"', html)), field
    return [unescape(error) for error in re.findall(r"<li>(.*?)</li>", found.group(1), re.S)]


def textarea(html: str, name: str = "descriptor") -> str:
    """The text of the first <textarea name=...> (Django's widget starts it with a
    newline, which the browser drops)."""
    found = re.search(rf'<textarea name="{name}"[^>]*>\n?(.*?)</textarea>', html, re.S)
    assert found, f"no textarea {name}"
    return unescape(found.group(1))


def follow_page(client, response) -> str:
    """The page a plain form post redirected to, with its flash messages."""
    assert response.status_code == 302, (response.status_code, response.content[:500])
    return text(client.get(response["Location"]))


# --- fixtures --------------------------------------------------------------------------


@pytest.fixture
def second(second_active) -> Snapshot:
    """shop/prod's snapshot #2 (4 workers become 8), published and active."""
    return second_active


@pytest.fixture
def candidate(second, environment, superuser) -> Snapshot:
    """shop/prod's snapshot #3: ready and NOT active (activation is now explicit),
    what a rollout stages."""
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    snapshot = publish_variant(environment, superuser, workers=16)
    environment.refresh_from_db()
    assert (snapshot.number, environment.active_snapshot_id) == (3, second.pk)
    return snapshot


@pytest.fixture
def nodes(environment):
    """web-1, web-2, web-3: enrolled agents of shop/prod."""
    return enrolled_agents(environment, 3)


@pytest.fixture
def rollout(candidate, nodes, environment) -> Rollout:
    """A running rollout of #3 with web-1 as its canary, then a manual wave."""
    return start_rollout(environment, candidate, [nodes[0]], waves=MANUAL_WAVES)


@pytest.fixture
def viewer(member):
    return member("viewer")


@pytest.fixture
def deployer(member):
    return member("deployer")


@pytest.fixture
def as_viewer(viewer):
    return session_client(viewer)


@pytest.fixture
def as_deployer(deployer):
    return session_client(deployer)


# --- sign-in ---------------------------------------------------------------------------


def test_login_page_renders_a_form_with_a_csrf_token(db):
    response = Client().get("/login/?next=/e/shop/prod/")

    assert response.status_code == 200
    html = text(response)
    assert "<h1>Sign in</h1>" in html
    assert 'name="username"' in html and 'name="password" type="password"' in html
    assert 'name="csrfmiddlewaretoken"' in html
    assert '<input type="hidden" name="next" value="/e/shop/prod/">' in html


def test_login_page_sends_a_signed_in_user_to_the_overview(environment, as_viewer):
    response = as_viewer.get("/login/")

    assert (response.status_code, response["Location"]) == (302, "/")


def test_login_with_a_demo_style_user_redirects_to_the_overview(environment, member):
    member("deployer", username="dev")
    client = Client(enforce_csrf_checks=True)
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"',
                      text(client.get("/login/"))).group(1)

    response = client.post("/login/", {"username": "dev", "password": "pw-dev",
                                       "csrfmiddlewaretoken": token})

    assert response.status_code == 302
    assert response["Location"] == "/"
    overview = client.get("/")
    assert overview.status_code == 200
    assert 'data-environment="shop/prod"' in text(overview)


def test_login_follows_next_to_the_page_asked_for(environment, member):
    member("deployer", username="dev")

    response = Client().post("/login/?next=/e/shop/prod/",
                             {"username": "dev", "password": "pw-dev", "next": "/e/shop/prod/"})

    assert (response.status_code, response["Location"]) == (302, "/e/shop/prod/")


def test_login_never_follows_next_to_another_site(environment, member):
    member("deployer", username="dev")

    response = Client().post("/login/", {"username": "dev", "password": "pw-dev",
                                         "next": "https://evil.example.com/"})

    assert (response.status_code, response["Location"]) == (302, "/")


def test_login_with_a_wrong_password_says_so_and_signs_nobody_in(environment, member):
    member("deployer", username="dev")
    client = Client()

    response = client.post("/login/", {"username": "dev", "password": "wrong"})

    assert response.status_code == 200
    assert "did not match" in text(response)
    assert client.get("/").status_code == 302


ANONYMOUS_PAGES = [
    "/",
    "/e/shop/prod/",
    "/e/shop/prod/?panel=agents",
    "/e/shop/prod/diff/",
    "/e/shop/prod/diff/?to=1",
    "/e/shop/prod/descriptor/",
    "/e/shop/prod/snapshots/1/rollback/",
    "/e/shop/prod/rollouts/new/",
]


@pytest.mark.parametrize("path", ANONYMOUS_PAGES)
def test_anonymous_get_of_every_page_redirects_to_login_with_next(path, first):
    response = Client().get(path)

    assert response.status_code == 302
    assert response["Location"] == "/login/?next=" + quote(path, safe="/")


@pytest.mark.parametrize("path", [
    "/e/shop/prod/deploy/",
    "/e/shop/prod/snapshots/1/rollback/",
    "/e/shop/prod/descriptor/",
    "/e/shop/prod/rollouts/new/",
    "/e/shop/prod/rollouts/{rollout}/confirm/",
    "/e/shop/prod/rollouts/{rollout}/rollback/",
])
def test_anonymous_posts_redirect_to_login_and_change_nothing(path, rollout):
    before, state = stored(), rollout_state(rollout)

    response = Client().post(path.format(rollout=rollout.pk), {
        "expected_version": rollout.version, "snapshot": "3"}, headers=HTMX)

    assert response.status_code == 302
    assert response["Location"].startswith("/login/?next=")
    assert (stored(), rollout_state(rollout)) == (before, state)


def test_logout_is_post_only(environment, viewer):
    client = session_client(viewer)

    refused = client.get("/logout/")
    still_in = client.get("/")
    signed_out = client.post("/logout/")

    assert refused.status_code == 405
    assert still_in.status_code == 200
    assert (signed_out.status_code, signed_out["Location"]) == (302, "/login/")
    assert client.get("/").status_code == 302


def test_sign_out_is_a_post_form_with_a_csrf_token(environment, as_viewer):
    html = text(as_viewer.get("/"))

    form = re.search(r'<form class="signout" method="post" action="/logout/">.*?</form>',
                     html, re.S)
    assert form and 'name="csrfmiddlewaretoken"' in form.group(0)


def test_pages_load_htmx_without_the_debug_script_that_replaces_them_on_a_4xx(
        environment, as_viewer, settings):
    # In DEBUG, django-htmx's script would show a refusal (400, 403, 404) as the whole
    # page instead of letting htmx swap it in place (make run is DEBUG).
    settings.DEBUG = True

    html = text(as_viewer.get("/"))

    assert re.search(r'<script src="/static/django_htmx/htmx-2\.min\.js" defer>', html)
    assert "django-htmx.js" not in html


# --- overview --------------------------------------------------------------------------


def test_overview_of_an_outsider_lists_none_of_the_tenants_environments(environment, outsider):
    html = text(session_client(outsider).get("/"))

    assert 'data-environment="shop/prod"' not in html
    assert 'data-environment="blog/prod"' in html


def test_overview_of_a_user_without_a_tenant_lists_nothing(environment, make_user):
    html = text(session_client(make_user("nobody")).get("/"))

    assert "data-environment=" not in html
    assert "You see no environments yet." in html


def test_overview_of_a_member_lists_their_tenants_environments_only(
        environment, application, superuser, outsider, as_viewer):
    staged_environment(application, "staging", superuser)

    html = text(as_viewer.get("/"))

    shown = re.findall(r'data-environment="([^"]+)"', html)
    assert shown == ["shop/prod", "shop/staging"]


def test_overview_shows_the_active_snapshot(second, as_viewer):
    row = _overview_row(as_viewer)

    assert f'<span class="snap">#2</span> <small>{second.label}</small>' in row


def test_overview_without_a_snapshot_says_none_yet(environment, as_viewer):
    assert "none yet" in _overview_row(as_viewer)


def _overview_row(client, name: str = "shop/prod") -> str:
    html = text(client.get("/"))
    found = re.search(rf'<tr data-environment="{name}">.*?</tr>', html, re.S)
    assert found, html[:1000]
    return found.group(0)


def _fleet_buckets(row: str) -> dict[str, int]:
    return {bucket: int(count) for count, bucket in re.findall(
        r'>(\d+) (in sync|held|behind|failed|offline)</span>', row)}


def test_overview_counts_the_fleet_in_sync_behind_failed_and_offline(
        environment, first, second, as_viewer):
    synced, behind, failed, offline, never = enrolled_agents(environment, 5)
    ack(synced, second)
    ack(behind, first)
    ack(failed, first)
    ack(failed, second, status="failed", message="nginx -t failed")
    ack(offline, second)
    for node in (synced, behind, failed, never):  # offline never polls
        assert poll(node.client).status_code == 200

    buckets = _fleet_buckets(_overview_row(as_viewer))

    # `never` polls but has applied nothing yet: it is behind too.
    assert buckets == {"in sync": 1, "held": 0, "behind": 2, "failed": 1, "offline": 1}


def test_overview_counts_changes_waiting_to_roll_out(environment, first, superuser, as_viewer):
    assert "nothing waiting" in _overview_row(as_viewer)

    environment_update(environment=environment, config=CONFIG + "extra: 1\n", actor=superuser)
    one = _overview_row(as_viewer)
    environment_file_put(environment=environment, kind="template", path="shop/extra.txt",
                         text="x\n", actor=superuser)
    two = _overview_row(as_viewer)

    assert "1 change waiting to roll out" in one
    assert "2 changes waiting to roll out" in two


def test_overview_shows_an_active_rollout(rollout, as_viewer):
    assert '<span class="badge running">#3 running</span>' in _overview_row(as_viewer)


def test_overview_htmx_request_gets_only_the_environments_partial(first, as_viewer):
    page = as_viewer.get("/")
    partial = as_viewer.get("/", headers=HTMX)

    assert page.status_code == partial.status_code == 200
    assert "<html" in text(page)
    assert is_partial(text(partial), "environments")
    assert 'data-environment="shop/prod"' in text(partial)
    for response in (page, partial):
        assert "HX-Request" in response["Vary"]


# --- an environment's page -------------------------------------------------------------


@pytest.mark.parametrize("path", ["/e/shop/prod/", "/e/shop/prod/?panel=agents",
                                  "/e/shop/prod/diff/", "/e/shop/prod/descriptor/",
                                  "/e/shop/prod/snapshots/1/rollback/",
                                  "/e/shop/prod/rollouts/new/"])
def test_pages_of_an_environment_the_user_cannot_see_are_404(path, first, outsider):
    response = session_client(outsider).get(path, headers=HTMX)

    assert response.status_code == 404
    assert b"shop.example.com" not in response.content


def test_an_unknown_environment_is_404(environment, as_viewer):
    assert as_viewer.get("/e/shop/nosuch/").status_code == 404


def test_environment_page_shows_every_panel(second, nodes, as_viewer):
    response = as_viewer.get(url("environment"))

    assert response.status_code == 200
    html = text(response)
    assert "<html" in html and "<h1>shop/prod</h1>" in html
    for panel in ("rollout", "agents", "snapshots", "pending"):
        section(html, panel)
    assert "HX-Request" in response["Vary"]


@pytest.mark.parametrize("panel", ["agents", "snapshots", "pending", "rollout"])
def test_each_panel_with_hx_request_returns_just_that_section(panel, rollout, as_viewer):
    response = as_viewer.get(url("environment") + f"?panel={panel}", headers=HTMX)

    assert response.status_code == 200
    html = text(response)
    assert is_partial(html, panel)
    assert html.count("<section") == 1
    assert 'id="flash"' not in html


def test_a_panel_asked_for_without_hx_request_gets_the_whole_page(first, as_viewer):
    html = text(as_viewer.get(url("environment") + "?panel=agents"))

    assert "<html" in html and 'id="snapshots"' in html


def test_an_unknown_panel_with_hx_request_gets_the_whole_page(first, as_viewer):
    html = text(as_viewer.get(url("environment") + "?panel=secrets", headers=HTMX))

    assert "<html" in html


def test_agent_rows_show_desired_and_applied_numbers(first, second, nodes, as_viewer):
    behind, synced, fresh_agent = nodes
    ack(behind, first)
    ack(synced, second)

    html = text(as_viewer.get(url("environment") + "?panel=agents", headers=HTMX))

    assert '<td class="desired">#2</td>' in agent_row(html, behind.agent)
    assert '<td class="applied">#1</td>' in agent_row(html, behind.agent)
    assert 'data-sync="behind"' in agent_row(html, behind.agent)
    assert '<td class="applied">#2</td>' in agent_row(html, synced.agent)
    assert 'data-sync="in_sync"' in agent_row(html, synced.agent)
    assert '<td class="applied">—</td>' in agent_row(html, fresh_agent.agent)
    assert "<small class=\"muted\">3</small>" in html  # the total


def test_a_pinned_agent_row_names_its_pin(rollout, nodes, as_viewer):
    html = text(as_viewer.get(url("environment") + "?panel=agents", headers=HTMX))

    canary = agent_row(html, nodes[0].agent)
    assert '<td class="desired">#3</td>' in canary
    assert f"held by rollout {rollout.pk} on #3" in canary
    assert 'data-sync="held"' in canary  # following its pin, not the environment
    assert '<td class="desired">#2</td>' in agent_row(html, nodes[1].agent)


def test_pending_panel_lists_the_changes_since_the_latest_snapshot(
        environment, first, superuser, as_viewer):
    environment_update(environment=environment, config=CONFIG + "extra: 1\n", actor=superuser)

    html = text(as_viewer.get(url("environment") + "?panel=pending", headers=HTMX))

    assert "1 change waiting to roll out since #1." in html
    assert "Changed config of shop/prod" in html


# --- role-aware buttons and the server's own refusals ---------------------------------


DEPLOYER_ONLY = ["Deploy #2 to all now", "Deploy now", "Submit a descriptor",
                 "Start a rollout", ">Confirm the canaries<", ">Roll back<", "roll back to"]


def test_a_viewer_sees_no_action_buttons(rollout, as_viewer):
    html = text(as_viewer.get(url("environment")))

    assert "Rollout" in html and "web-1" in html  # the page itself is there
    for label in DEPLOYER_ONLY:
        assert label not in html, label
    assert "Deploy" not in html
    assert 'method="post" action="/e/' not in html


DEPLOY_BUTTONS = ["Deploy #2 to all now", "Deploy now"]


def test_a_deployer_sees_the_action_buttons(rollout, as_deployer):
    html = text(as_deployer.get(url("environment")))

    for label in DEPLOYER_ONLY:
        if label not in DEPLOY_BUTTONS:
            assert label in html, label
    assert f'value="{rollout.version}"' in html  # the version confirm and roll back expect


def test_a_deployer_sees_the_deploy_buttons_when_no_rollout_holds_the_agents(
        second, nodes, as_deployer):
    html = text(as_deployer.get(url("environment")))

    assert "Deploy #2 to all now" in html
    assert html.count(">Deploy now</button>") == len(nodes)


def test_agents_a_rollout_holds_offer_no_push_it_would_refuse(rollout, as_deployer):
    # The rollout pins every target: a push to them is refused (agent_pinned).
    html = text(as_deployer.get(url("environment")))

    for label in DEPLOY_BUTTONS:
        assert label not in html, label


@pytest.mark.parametrize("path", ["descriptor", "rollout-new"])
def test_a_viewer_is_told_the_forms_need_the_deployer_role(path, second, as_viewer):
    html = text(as_viewer.get(url(path)))

    assert re.search(r"needs the deployer role here", html)
    assert "<button" not in html.split("<main>")[1]  # no form they could not send


def test_a_viewer_sees_the_rollback_page_without_its_button(second, as_viewer):
    html = text(as_viewer.get(url("snapshot-rollback", 1)))

    assert "Rolling back needs the deployer role here." in html
    assert "<button" not in html.split("<main>")[1]


@pytest.fixture
def world(environment, second, nodes, application, superuser):
    """shop/prod: #2 active over web-1..3, where a deployer could deploy, publish a
    descriptor, roll back to #1 and start a rollout; shop/staging: a rollout whose
    canary acknowledged, so it could be confirmed or rolled back."""
    staging, _, staged = staged_environment(application, "staging", superuser)
    canary, _ = enrolled_agents(staging, 2, prefix="stg")
    staging_rollout = start_rollout(staging, staged, [canary], waves=MANUAL_WAVES)
    ack(canary, staged)
    return {"nodes": nodes, "rollout": staging_rollout, "staged": staged}


def _minimal_descriptor() -> str:
    return yaml.safe_dump({"apiVersion": "bellwether/v1", "application": "shop",
                           "environment": "prod", "id": "rel-1", "version": "1"})


ACTIONS = {
    "deploy to all": lambda w: (url("deploy"), {"agent": "all"}),
    "deploy to one": lambda w: (url("deploy"), {"agent": w["nodes"][1].pk}),
    "descriptor preview": lambda w: (url("descriptor"), {"descriptor": _minimal_descriptor(),
                                                        "step": "preview"}),
    "descriptor publish": lambda w: (url("descriptor"), {"descriptor": _minimal_descriptor(),
                                                        "step": "publish"}),
    "snapshot rollback": lambda w: (url("snapshot-rollback", 1), {}),
    "rollout new": lambda w: (url("rollout-new"), {"snapshot": "2", "waves": "100",
                                                   "canary": [w["nodes"][0].pk]}),
    "rollout confirm": lambda w: (
        url("rollout-confirm", w["rollout"].pk, env=("shop", "staging")),
        {"expected_version": w["rollout"].version}),
    "rollout rollback": lambda w: (
        url("rollout-rollback", w["rollout"].pk, env=("shop", "staging")),
        {"expected_version": w["rollout"].version}),
}


def _world_state(world) -> tuple:
    generations = dict(Agent.objects.values_list("name", "generation"))
    return stored(), rollout_state(world["rollout"]), generations


@pytest.mark.parametrize("htmx", [False, True], ids=["form", "htmx"])
@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_viewers_post_is_refused_with_403_and_changes_nothing(action, htmx, world,
                                                                as_viewer):
    path, data = ACTIONS[action](world)
    before = _world_state(world)

    response = as_viewer.post(path, data, headers=HTMX if htmx else {})

    assert response.status_code == 403, (response.status_code, response.content[:500])
    assert _world_state(world) == before


def test_a_viewers_refused_descriptor_gets_the_reason_and_no_form(world, as_viewer):
    response = as_viewer.post(url("descriptor"), {"descriptor": _minimal_descriptor()},
                              headers=HTMX)

    assert response.status_code == 403
    assert "<form" not in text(response)
    assert '<p class="msg error">' in section(text(response), "preview")


@pytest.mark.parametrize("action", list(ACTIONS))
def test_a_deployers_same_post_is_carried_out(action, world, as_deployer):
    path, data = ACTIONS[action](world)
    before = _world_state(world)

    response = as_deployer.post(path, data)

    expected = 200 if action == "descriptor preview" else 302  # a plain form: back to the page
    assert response.status_code == expected, (response.status_code, response.content[:500])
    if action != "descriptor preview":  # a preview records nothing
        assert _world_state(world) != before


# --- CSRF -------------------------------------------------------------------------------


def test_a_post_without_the_csrf_token_is_refused(second, nodes, deployer):
    client = session_client(deployer, enforce_csrf_checks=True)
    client.get(url("environment"))  # the CSRF cookie is set, but the token is not sent

    response = client.post(url("deploy"), headers=HTMX)

    assert response.status_code == 403
    assert not Deployment.objects.exists()
    # htmx keeps the page as it is and shows why in the flash.
    assert response["HX-Reswap"] == "none"
    assert "Nothing was done: reload the page" in flash(text(response))


def test_a_plain_post_without_the_csrf_token_gets_djangos_page(second, nodes, deployer):
    client = session_client(deployer, enforce_csrf_checks=True)

    response = client.post(url("deploy"))

    assert response.status_code == 403
    assert "CSRF verification failed" in text(response)
    assert not Deployment.objects.exists()


def test_an_htmx_post_with_the_token_from_hx_headers_succeeds(second, nodes, deployer):
    client = session_client(deployer, enforce_csrf_checks=True)
    page = text(client.get(url("environment")))
    token = re.search(r"""<body hx-headers='\{"X-CSRFToken": "([^"]+)"\}'""", page).group(1)

    response = client.post(url("deploy"), {"agent": "all"},
                           headers={**HTMX, "X-CSRFToken": token})

    assert response.status_code == 200, response.content[:500]
    assert Deployment.objects.count() == 3


# --- deploy now -------------------------------------------------------------------------


def test_deploy_now_pushes_the_active_snapshot_to_every_enabled_agent(second, nodes,
                                                                      as_deployer, deployer):
    fleet_services.agent_update(agent=nodes[2].agent, actor=None, enabled=False)
    page = text(as_deployer.get(url("environment")))
    assert '<input type="hidden" name="agent" value="all">' in page  # the "to all" button

    response = as_deployer.post(url("deploy"), {"agent": "all"})

    page = follow_page(as_deployer, response)
    pushes = Deployment.objects.order_by("agent__name")
    assert [(d.agent.name, d.snapshot.number, d.kind, d.state, d.created_by) for d in pushes] == [
        ("web-1", 2, "push", "pending", deployer), ("web-2", 2, "push", "pending", deployer)]
    assert "Pushed #2 to 2 agent(s)." in flash(page)
    assert AuditEvent.objects.filter(action="snapshot.deploy", actor=deployer).count() == 1


def test_deploy_now_to_one_agent_answers_the_agents_panel_and_an_oob_flash(second, nodes,
                                                                           as_deployer):
    target = nodes[1]

    response = as_deployer.post(url("deploy"), {"agent": target.pk}, headers=HTMX)

    assert response.status_code == 200
    html = text(response)
    assert html.lstrip().startswith('<section id="agents"')
    assert "<html" not in html
    oob = flash(html)
    assert 'hx-swap-oob="true"' in oob
    assert "Pushed #2 to 1 agent(s)." in oob
    assert list(Deployment.objects.values_list("agent_id", "kind", "snapshot__number")) == [
        (target.pk, "push", 2)]


@pytest.mark.parametrize(("agent", "status", "message"), [
    ("abc", 400, "agent: not an agent id."),
    ("-1", 400, "agent: not an agent id."),
    ("", 400, "agent: choose an agent, or all agents."),
    ("999999", 400, "agents: [999999] are no agents of shop/prod."),
])
def test_deploy_now_to_a_bad_agent_id_is_refused_with_a_message_and_creates_nothing(
        agent, status, message, second, nodes, as_deployer):
    before = stored()

    response = as_deployer.post(url("deploy"), {"agent": agent}, headers=HTMX)

    assert response.status_code == status
    assert message in flash(text(response))
    assert is_partial(text(response).split('<div id="flash"')[0], "agents")
    assert stored() == before


def test_deploy_now_to_an_agent_of_another_tenant_is_refused(second, nodes, as_deployer, blog):
    (stranger,) = enrolled_agents(blog, 1, prefix="blog")
    before = stored()

    response = as_deployer.post(url("deploy"), {"agent": stranger.pk}, headers=HTMX)

    assert response.status_code == 400  # as for an id that is no agent at all
    assert f"[{stranger.pk}] are no agents of shop/prod" in flash(text(response))
    assert stored() == before


def test_deploy_now_as_a_plain_form_with_a_bad_agent_answers_400_with_the_page(
        second, nodes, as_deployer):
    response = as_deployer.post(url("deploy"), {"agent": "abc"})

    assert response.status_code == 400
    assert "agent: not an agent id." in flash(text(response))
    assert '<section id="agents"' in text(response)  # the whole page, to go on from
    assert not Deployment.objects.exists()


def test_deploy_now_never_pushes_another_snapshot_than_the_button_named(
        second, nodes, environment, superuser, as_deployer):
    page = text(as_deployer.get(url("environment")))
    assert '<input type="hidden" name="snapshot" value="2">' in page
    publish_variant(environment, superuser, workers=16)  # #3 active after the page loaded

    response = as_deployer.post(url("deploy"), {"snapshot": "2", "agent": nodes[0].pk},
                                headers=HTMX)

    # #2 is older than the active #3 now: refused with the reason, #3 not pushed either.
    assert response.status_code == 409
    assert "#2" in flash(text(response))
    assert not Deployment.objects.exists()


def test_an_anonymous_action_comes_back_to_the_environment_page_after_signing_in(rollout):
    for name, args in (("deploy", ()), ("rollout-confirm", (rollout.pk,)),
                       ("rollout-rollback", (rollout.pk,))):
        response = Client().post(url(name, *args))

        assert response["Location"] == "/login/?next=" + quote("/e/shop/prod/", safe="/")


def test_the_page_head_refetches_the_active_snapshot_on_its_own(second, as_viewer):
    html = text(as_viewer.get(url("environment") + "?panel=summary", headers=HTMX))

    assert html.lstrip().startswith('<p id="summary"') and "#2" in html



def test_deploy_now_before_any_snapshot_says_to_publish_first(environment, nodes, as_deployer):
    response = as_deployer.post(url("deploy"), {"agent": "all"}, headers=HTMX)

    assert response.status_code == 400
    assert "snapshot: nothing to deploy yet: publish a snapshot first." in flash(text(response))


@pytest.mark.parametrize("headers", [HTMX, {}])
def test_deploy_now_with_nothing_chosen_pushes_nothing(second, nodes, deployer, headers):
    """An empty body (as a script might send, token and all) is not "every agent"."""
    client = session_client(deployer, enforce_csrf_checks=True)
    page = text(client.get(url("environment")))
    token = re.search(r"""<body hx-headers='\{"X-CSRFToken": "([^"]+)"\}'""", page).group(1)
    before = stored()

    response = client.post(url("deploy"), headers={**headers, "X-CSRFToken": token})

    assert response.status_code == 400
    assert "agent: choose an agent, or all agents." in flash(text(response))
    assert stored() == before and not Deployment.objects.exists()


def test_deploy_is_post_only(second, as_deployer):
    assert as_deployer.get(url("deploy")).status_code == 405


# --- descriptors ------------------------------------------------------------------------


RELEASE_TEMPLATE = """dest_dir = {{ params.dest_dir }}
feature = {{ params.feature | default("off") }}
"""


def release(**fields) -> dict:
    return {"apiVersion": "bellwether/v1", "application": "shop", "environment": "prod",
            "id": "rel-2.4.0", "version": "2.4.0", "params": {"feature": "on"}, **fields}


def as_yaml(value) -> str:
    return yaml.safe_dump(value, sort_keys=False)


@pytest.fixture
def releasable(environment, superuser) -> Environment:
    """shop/prod with params.dest_dir, a template showing the params, a platform
    policy that lets a descriptor add params.feature, and #1 (feature off) active."""
    policy_publish(content={"descriptor_policy": {"params": ["feature"]}}, actor=superuser)
    env = environment_update(environment=environment,
                             config=CONFIG + "params:\n  dest_dir: /opt/shop\n", actor=superuser)
    environment_file_put(environment=env, kind="template", path="shop/release.conf",
                         text=RELEASE_TEMPLATE, actor=superuser)
    assert publish(env, superuser).number == 1
    env.refresh_from_db()
    return env


def test_descriptor_form_renders_for_a_deployer(releasable, as_deployer):
    response = as_deployer.get(url("descriptor"))

    assert response.status_code == 200
    html = text(response)
    assert '<textarea name="descriptor"' in html
    assert '<input type="file" name="file"' in html
    assert 'enctype="multipart/form-data"' in html
    assert "viewer role" not in html


def _assert_preview(html: str) -> None:
    preview = section(html, "preview")
    assert '<span class="badge ready">renders</span>' in preview
    config = yaml.safe_load(unescape(
        re.search(r'<pre class="bw-file">(.*?)</pre>', preview, re.S).group(1)))
    assert config["params"] == {"dest_dir": "/opt/shop", "feature": "on"}
    assert config["descriptor"] == {"id": "rel-2.4.0", "version": "2.4.0"}
    provenance = dict(re.findall(r'<td><code>([^<]+)</code></td><td><span class="badge '
                                 r'layer-[a-z]+">([a-z]+)</span>', preview))
    assert provenance["params.feature"] == "descriptor"
    assert provenance["params.dest_dir"] == "environment"
    assert provenance["workers"] == "environment"
    assert "Diff against the active #1" in preview
    assert '<h4 class="bw-file-head">shop/release.conf <small>(modified)</small></h4>' in preview
    assert '<div class="del">-feature = off</div>' in preview
    assert '<div class="add">+feature = on</div>' in preview
    assert '<input type="hidden" name="step" value="publish">' in preview


def test_preview_of_a_pasted_descriptor_shows_config_provenance_and_diff(releasable,
                                                                         as_deployer):
    before = stored()

    response = as_deployer.post(url("descriptor"), {"descriptor": as_yaml(release()),
                                                    "step": "preview"}, headers=HTMX)

    assert response.status_code == 200
    assert is_partial(text(response), "preview")
    _assert_preview(text(response))
    assert stored() == before


def test_preview_of_an_uploaded_descriptor_file_works_too(releasable, as_deployer):
    upload = SimpleUploadedFile("release.yaml", as_yaml(release()).encode(),
                                content_type="application/yaml")
    before = stored()

    response = as_deployer.post(url("descriptor"), {"file": upload, "step": "preview"})

    assert response.status_code == 200
    html = text(response)
    assert "<html" in html  # a plain post gets the whole page
    _assert_preview(html)
    assert "rel-2.4.0" in re.search(r"<textarea name=\"descriptor\".*?</textarea>", html,
                                    re.S).group(0)
    assert stored() == before


def test_a_json_descriptor_previews_like_yaml(releasable, as_deployer):
    response = as_deployer.post(url("descriptor"), {"descriptor": json.dumps(release())},
                                headers=HTMX)

    assert response.status_code == 200
    _assert_preview(text(response))


@transactional
def test_publish_creates_a_snapshot_and_redirects_with_a_success_message(releasable,
                                                                         as_deployer, deployer):
    response = as_deployer.post(url("descriptor"), {"descriptor": as_yaml(release()),
                                                    "step": "publish"})

    assert (response.status_code, response["Location"]) == (302, url("environment"))
    snapshot = Snapshot.objects.get(environment=releasable, number=2)
    assert (snapshot.state, snapshot.author) == ("ready", deployer)
    assert snapshot.effective_config["params"] == {"dest_dir": "/opt/shop", "feature": "on"}
    assert Descriptor.objects.get().descriptor_id == "rel-2.4.0"
    page = text(as_deployer.get(response["Location"]))
    assert '<p class="msg success">Published #2.</p>' in flash(page)
    assert 'id="snapshot-2"' in section(page, "snapshots")


@transactional
def test_publishing_the_same_descriptor_again_says_it_was_already_published(releasable,
                                                                            as_deployer):
    data = {"descriptor": as_yaml(release()), "step": "publish"}
    as_deployer.post(url("descriptor"), data)
    before = stored()

    again = as_deployer.post(url("descriptor"), data)

    assert "already published as #2" in flash(follow_page(as_deployer, again))
    assert stored() == before


# What is wrong with the text itself shows under the descriptor field; a refusal of
# the layers (a merge conflict) shows in the preview with its details, as a whole.
BAD_DESCRIPTORS = {
    "invalid yaml": ("apiVersion: bellwether/v1\napplication: shop\nid: rel: 1\n",
                     "descriptor",
                     ["descriptor:3:", "mapping values are not allowed in this context"]),
    "another environment": (as_yaml(release(environment="staging")), "descriptor",
                            ["The descriptor is for shop/staging, not shop/prod."]),
    "another tenant's application": (as_yaml(release(application="blog")), "descriptor",
                                     ["The descriptor is for blog/prod, not shop/prod."]),
    "merge conflict": (as_yaml(release(params={"dest_dir": "/srv/other"})), "preview",
                       ["does not merge", "params.dest_dir", "/opt/shop", "/srv/other"]),
    "not a mapping": ("- just\n- a list\n", "descriptor", ["A descriptor must be a mapping."]),
    "no id": (as_yaml({k: v for k, v in release().items() if k != "id"}), "descriptor",
              ["descriptor id: required"]),
    "no id, no version string": (as_yaml({**{k: v for k, v in release().items() if k != "id"},
                                          "version": ["x"]}), "descriptor",
                                 ["descriptor id: required", "version: must be a string"]),
    "empty": ("   \n", "descriptor", ["Paste a descriptor or choose a file."]),
}


@pytest.mark.parametrize("step", ["preview", "publish"])
@pytest.mark.parametrize("case", list(BAD_DESCRIPTORS))
def test_a_bad_descriptor_is_400_with_the_reason_and_nothing_is_written(case, step,
                                                                        releasable,
                                                                        as_deployer):
    body, where, expected = BAD_DESCRIPTORS[case]
    before = stored()

    response = as_deployer.post(url("descriptor"), {"descriptor": body, "step": step},
                                headers=HTMX)

    assert response.status_code == 400, response.content[:500]
    html = text(response)
    preview = section(html, "preview")
    assert is_partial(html, "preview")  # htmx's target, then the form out of band
    form = re.search(r'<form id="descriptor-form"[^>]*>.*?</form>', html, re.S).group(0)
    assert 'hx-swap-oob="true"' in form
    assert textarea(form) == body  # what was pasted stays, to be fixed
    if where == "preview":
        assert '<p class="msg error">' in preview
        assert field_errors(html, "descriptor") == []
        shown = preview
    else:
        assert "msg error" not in preview and "Publish" not in preview
        shown = "\n".join(field_errors(html, "descriptor"))
    for words in expected:
        assert words in shown, (words, shown)
    assert stored() == before


def test_a_bad_descriptor_posted_as_a_plain_form_gets_the_page_with_the_error_by_the_field(
        releasable, as_deployer):
    body = "apiVersion: bellwether/v1\napplication: shop\nid: rel: 1\n"

    response = as_deployer.post(url("descriptor"), {"descriptor": body, "step": "preview"})

    assert response.status_code == 400
    html = text(response)
    assert "<html" in html and "hx-swap-oob" not in html
    assert textarea(html) == body
    assert field_errors(html, "descriptor") == [
        "descriptor:3: mapping values are not allowed in this context"]
    # The error list sits right after the field it describes.
    assert re.search(r'<textarea name="descriptor"[^>]*aria-describedby="id_descriptor_error"'
                     r'[^>]*>.*?</textarea></label><ul class="errorlist" '
                     r'id="id_descriptor_error">', html, re.S)


def test_a_valid_preview_clears_the_errors_of_the_previous_attempt(releasable, as_deployer):
    body = as_yaml(release())

    response = as_deployer.post(url("descriptor"), {"descriptor": body}, headers=HTMX)

    assert response.status_code == 200
    html = text(response)
    form = re.search(r'<form id="descriptor-form"[^>]*>.*?</form>', html, re.S).group(0)
    assert 'hx-swap-oob="true"' in form and "errorlist" not in form
    assert textarea(form) == body
    assert '<input type="hidden" name="step" value="preview">' in form


@transactional
def test_an_htmx_publish_sends_the_browser_to_the_environment_page(releasable, as_deployer):
    response = as_deployer.post(url("descriptor"), {"descriptor": as_yaml(release()),
                                                    "step": "publish"}, headers=HTMX)

    assert response.status_code == 200
    assert response["HX-Redirect"] == url("environment")
    assert "Published #2." in flash(text(as_deployer.get(url("environment"))))


def test_an_invalid_uploaded_file_is_400_naming_the_file_and_line(releasable, as_deployer):
    upload = SimpleUploadedFile("release.yaml", b"apiVersion: bellwether/v1\nid: [unclosed\n")
    before = stored()

    response = as_deployer.post(url("descriptor"), {"file": upload, "step": "publish"})

    assert response.status_code == 400
    (error,) = field_errors(text(response), "file")
    assert re.match(r"release\.yaml:\d+: ", error), error
    assert field_errors(text(response), "descriptor") == []
    assert stored() == before


def test_an_uploaded_file_is_shown_in_the_textarea_after_its_preview(releasable, as_deployer):
    upload = SimpleUploadedFile("release.yaml", as_yaml(release()).encode())

    response = as_deployer.post(url("descriptor"), {"file": upload, "descriptor": "ignored"},
                                headers=HTMX)

    assert response.status_code == 200
    assert textarea(text(response)) == as_yaml(release())  # the file wins over the paste


def test_an_uploaded_file_that_is_not_utf8_is_400(releasable, as_deployer):
    upload = SimpleUploadedFile("release.yaml", b"id: \xff\xfe\n")

    response = as_deployer.post(url("descriptor"), {"file": upload})

    assert response.status_code == 400
    assert field_errors(text(response), "file") == ["release.yaml: not UTF-8 text."]


def test_a_descriptor_over_the_size_limit_is_400(releasable, as_deployer):
    body = as_yaml(release(notes="x" * (256 * 1024)))

    response = as_deployer.post(url("descriptor"), {"descriptor": body})

    assert response.status_code == 400
    assert field_errors(text(response), "descriptor") == [
        "descriptor: larger than 262144 bytes."]


def test_an_uploaded_file_over_the_size_limit_is_400_without_reading_it(releasable,
                                                                        as_deployer):
    upload = SimpleUploadedFile("big.yaml", b"#" * (256 * 1024 + 1))

    response = as_deployer.post(url("descriptor"), {"file": upload, "descriptor": "kept"})

    assert response.status_code == 400
    assert field_errors(text(response), "file") == ["big.yaml: larger than 262144 bytes."]
    assert textarea(text(response)) == "kept"


def test_descriptor_text_is_escaped_when_shown_again(releasable, as_deployer):
    body = "id: rel\n# </textarea><script>alert(1)</script>\n"

    response = as_deployer.post(url("descriptor"), {"descriptor": body})

    assert response.status_code == 400
    assert "<script>alert(1)</script>" not in text(response)
    assert "&lt;/textarea&gt;&lt;script&gt;" in text(response)
    assert textarea(text(response)) == body
    assert field_errors(text(response), "descriptor")


# --- the diff viewer --------------------------------------------------------------------


@pytest.fixture
def third(second, environment, superuser) -> Snapshot:
    """#3: 8 workers become 16, active."""
    snapshot = publish_variant(environment, superuser, workers=16)
    assert snapshot.number == 3
    return snapshot


@pytest.mark.parametrize(("to", "against", "old", "new"), [
    (2, 1, 4, 8), (1, 2, 8, 4), (3, 1, 4, 16), (3, None, 8, 16)])
def test_diff_of_any_two_snapshots_colours_each_files_lines(to, against, old, new, third,
                                                           as_viewer):
    query = f"?to={to}" + (f"&from={against}" if against else "")

    response = as_viewer.get(url("diff") + query)

    assert response.status_code == 200
    result = section(text(response), "result")
    assert f"#{to} against #{against or to - 1}" in result
    assert "1 file changed" in result
    assert '<h4 class="bw-file-head">shop/app.json <small>(modified)</small></h4>' in result
    assert (f'<div class="del">-{{&quot;log_level&quot;: &quot;info&quot;, '
            f'&quot;workers&quot;: {old}}}</div>') in result
    assert (f'<div class="add">+{{&quot;log_level&quot;: &quot;info&quot;, '
            f'&quot;workers&quot;: {new}}}</div>') in result
    assert '<div class="head">--- a/shop/app.json</div>' in result
    assert '<div class="hunk">@@' in result


def test_diff_of_the_first_snapshot_is_against_nothing(first, as_viewer):
    result = section(text(as_viewer.get(url("diff") + "?to=1")), "result")

    assert "against nothing (the first snapshot)" in result
    assert "(added)" in result and '<div class="add">+' in result
    assert '<div class="del">' not in result


def test_diff_htmx_request_gets_only_the_result_partial(second, as_viewer):
    response = as_viewer.get(url("diff") + "?to=2&from=1", headers=HTMX)

    assert response.status_code == 200
    assert is_partial(text(response), "result")
    assert '<div class="add">' in text(response)
    assert "HX-Request" in response["Vary"]


def test_diff_page_without_a_choice_offers_the_ready_snapshots(second, as_viewer):
    html = text(as_viewer.get(url("diff")))

    # Nothing asked: the active #2 against the one before.
    assert "#2 against #1" in section(html, "result")
    assert re.findall(r'<select name="to"[^>]*>(.*?)</select>', html, re.S)[0].count(
        "<option") == 2
    assert "errorlist" not in html


def test_diff_form_keeps_the_two_snapshots_compared(third, as_viewer):
    html = text(as_viewer.get(url("diff") + "?to=3&from=1", headers=HTMX))

    form = re.search(r'<form id="diff-form".*?</form>', html, re.S).group(0)
    assert 'hx-swap-oob="true"' in form  # htmx swaps it with the result
    for name, number in (("from", 1), ("to", 3)):
        select = re.search(rf'<select name="{name}"[^>]*>(.*?)</select>', form, re.S).group(1)
        assert re.findall(r'<option value="(\d*)" selected>', select) == [str(number)]


# Not ASCII digits: "²" and "٣" (int() takes the second: 3); beyond 32 bits; more
# digits than int() converts at all; signs, decimals, zero.
JUNK_NUMBERS = ["abc", "-1", "+1", "1.5", "0", " 2", "\u00b2", "\u0663", "9" * 20, "9" * 5000]


@pytest.mark.parametrize("field", ["to", "from"])
@pytest.mark.parametrize("junk", JUNK_NUMBERS, ids=range(len(JUNK_NUMBERS)))
def test_diff_with_junk_numbers_is_400_with_the_error_by_the_field(field, junk, second,
                                                                    as_viewer):
    query = {"to": "2", field: junk}

    response = as_viewer.get(url("diff"), query, headers=HTMX)

    assert response.status_code == 400
    html = text(response)
    assert field_errors(html, field) == ["pick a snapshot number."]
    assert "Pick two snapshots." in section(html, "result")


@pytest.mark.parametrize(("query", "field", "missing"), [("?to=99", "to", 99),
                                                         ("?to=2&from=42", "from", 42)])
def test_diff_of_an_unknown_snapshot_is_404_with_the_error_by_the_field(
        query, field, missing, second, as_viewer):
    response = as_viewer.get(url("diff") + query)

    assert response.status_code == 404
    assert field_errors(text(response), field) == [f"Snapshot {missing} of shop/prod not found."]


def test_diff_lines_are_escaped(first, environment, superuser, as_viewer):
    environment_file_put(environment=environment, kind="template", path="www/x.html",
                         text="<script>alert(1)</script>\n", actor=superuser)
    publish(environment, superuser)

    html = text(as_viewer.get(url("diff") + "?to=2"))

    assert "<script>alert(1)</script>" not in html
    assert '<div class="add">+&lt;script&gt;alert(1)&lt;/script&gt;</div>' in html


# --- rolling back to a snapshot ---------------------------------------------------------


def test_rollback_confirmation_page_asks_before_rolling_back(second, as_deployer):
    response = as_deployer.get(url("snapshot-rollback", 1))

    assert response.status_code == 200
    html = text(response)
    assert "<h1>Roll back to #1?</h1>" in html
    assert "replacing the active <span class=\"snap\">#2</span>" in html
    assert f'action="{url("snapshot-rollback", 1)}"' in html
    assert 'href="/e/shop/prod/diff/?from=2&amp;to=1"' in html  # what the rollback changes
    assert not Publication.objects.filter(kind="rollback").exists()


def test_rollback_page_of_an_unknown_snapshot_is_404(second, as_deployer):
    assert as_deployer.get(url("snapshot-rollback", 9)).status_code == 404


@transactional
def test_rollback_creates_a_new_higher_snapshot_with_the_old_files(environment, second,
                                                                   as_deployer, deployer):
    old = Snapshot.objects.get(environment=environment, number=1)

    response = as_deployer.post(url("snapshot-rollback", 1))

    page = follow_page(as_deployer, response)
    rolled = Snapshot.objects.get(environment=environment, number=3)
    assert (rolled.state, rolled.rolled_back_from, rolled.author) == ("ready", old, deployer)
    assert rolled.files == old.files and rolled.checksum == old.checksum
    environment.refresh_from_db()
    assert environment.active_snapshot == rolled
    assert "Rolled back to #1 as #3." in flash(page)


def test_rollback_during_an_active_rollout_is_refused_with_409(rollout, as_deployer):
    before = stored()

    response = as_deployer.post(url("snapshot-rollback", 1), headers=HTMX)

    assert response.status_code == 409
    assert is_partial(text(response).split('<div id="flash"')[0], "snapshots")
    assert "has an active rollout; roll that back instead." in flash(text(response))
    assert stored() == before


# --- rollouts ---------------------------------------------------------------------------


def test_rollout_form_offers_ready_snapshots_and_enabled_agents(candidate, nodes, superuser,
                                                                as_deployer):
    fleet_services.agent_update(agent=nodes[2].agent, actor=superuser, enabled=False)

    response = as_deployer.get(url("rollout-new"))

    assert response.status_code == 200
    html = text(response)
    # Only what may roll out: newer than the active #2, the newest chosen.
    assert re.findall(r'<option value="(\d+)"[^>]*>', html) == ["3"]
    assert '<option value="3" selected>' in html
    assert re.findall(r'name="canary" value="(\d+)"', html) == [str(nodes[0].pk),
                                                                  str(nodes[1].pk)]


def test_the_rollout_form_says_when_there_is_nothing_to_roll_out(second, nodes, as_deployer):
    html = text(as_deployer.get(url("rollout-new")))

    assert re.search(r'id="nothing-to-roll-out">Nothing to roll out: <span class="snap">#2</span> '
                     r"is active and no newer snapshot is ready\. Publish a change first", html)
    assert "<form" not in html.split("<main>")[1]  # no empty form to fill in


def test_starting_a_rollout_with_chosen_canaries(candidate, nodes, as_deployer, deployer):
    response = as_deployer.post(url("rollout-new"), {
        "snapshot": "3", "canary": [nodes[0].pk, nodes[2].pk], "waves": "50, 100",
        "gate": "manual"})

    page = follow_page(as_deployer, response)
    started = Rollout.objects.get()
    assert (started.snapshot.number, started.state, started.created_by) == (3, "running",
                                                                            deployer)
    assert [w["gate"] for w in started.waves] == ["manual", "manual"]
    canaries = RolloutTarget.objects.filter(rollout=started, wave=0)
    assert sorted(canaries.values_list("agent__name", flat=True)) == ["web-1", "web-3"]
    assert f"Rollout {started.pk} of #3 started" in flash(page)
    assert "the canaries" in section(page, "rollout")


def test_rollout_form_starts_with_two_waves_behind_a_manual_gate(candidate, nodes,
                                                                  as_deployer):
    html = text(as_deployer.get(url("rollout-new")))

    assert re.search(r'<input type="text" name="waves" value="50, 100"', html)
    assert '<option value="manual" selected>' in html
    assert "errorlist" not in html and "checked" not in html


@pytest.mark.parametrize(("data", "status", "field", "message"), [
    ({"snapshot": "3"}, 400, "canary", "Name the canaries: pick at least one agent."),
    ({"snapshot": "", "canary": ["1"]}, 400, "snapshot", "pick a snapshot to roll out."),
    ({"snapshot": "3", "canary": ["x"]}, 400, "canary", "not an agent id."),
    ({"snapshot": "3", "canary": ["{web1}"], "waves": "0, 200"}, 400, "waves",
     "percentages from 1 to 100, separated by commas."),
    ({"snapshot": "3", "canary": ["{web1}"], "waves": " , "}, 400, "waves",
     "percentages from 1 to 100, separated by commas."),
    ({"snapshot": "3", "canary": ["{web1}"], "gate": "yolo"}, 400, "gate",
     "one of manual, auto."),
    ({"snapshot": "99", "canary": ["{web1}"]}, 404, "snapshot",
     "Snapshot 99 of shop/prod not found."),
    ({"snapshot": "3", "canary": ["999999"]}, 400, "canary",
     "canary_agents: [999999] are no agents of shop/prod."),
])
def test_a_rollout_with_bad_choices_is_refused_with_the_error_by_the_field(
        data, status, field, message, candidate, nodes, as_deployer):
    data = {k: [c.format(web1=nodes[0].pk) for c in v] if isinstance(v, list) else v
            for k, v in data.items()}

    response = as_deployer.post(url("rollout-new"), data)

    assert response.status_code == status
    html = text(response)
    assert field_errors(html, field) == [message]
    assert len(re.findall(r'<ul class="errorlist"', html)) == 1  # no other field blamed
    assert '<p class="msg error">' not in html
    assert not Rollout.objects.exists()


def test_a_refused_rollout_form_keeps_every_value_entered(candidate, nodes, as_deployer):
    canaries = [nodes[0].pk, nodes[2].pk]

    response = as_deployer.post(url("rollout-new"), {
        "snapshot": "3", "canary": canaries, "waves": "10, 0%", "gate": "auto"})

    assert response.status_code == 400
    html = text(response)
    assert field_errors(html, "waves") == ["percentages from 1 to 100, separated by commas."]
    assert re.findall(r'<option value="(\d+)" selected>', html) == ["3"]
    assert re.findall(r'name="canary" value="(\d+)"[^>]* checked', html) == [
        str(pk) for pk in canaries]
    assert re.search(r'<input type="text" name="waves" value="10, 0%"', html)
    assert '<option value="auto" selected>' in html


def test_a_second_rollout_while_one_is_active_is_409(rollout, nodes, as_deployer):
    response = as_deployer.post(url("rollout-new"), {"snapshot": "3", "canary": [nodes[1].pk]})

    # About none of the fields: said above the form, which keeps what was entered.
    assert response.status_code == 409
    html = text(response)
    assert '<p class="msg error">shop/prod already has an active rollout.</p>' in html
    assert "errorlist" not in html
    assert re.findall(r'name="canary" value="(\d+)"[^>]* checked', html) == [str(nodes[1].pk)]
    assert Rollout.objects.count() == 1


def test_confirm_after_the_canary_acknowledged_advances_the_rollout(rollout, candidate,
                                                                    nodes, as_deployer):
    ack(nodes[0], candidate)  # web-1 reports #3 with its exact checksum
    page = text(as_deployer.get(url("environment") + "?panel=rollout", headers=HTMX))
    version = int(re.search(r'name="expected_version" value="(\d+)"', page).group(1))
    assert ">web-1</dd>" in page  # acknowledged

    response = as_deployer.post(url("rollout-confirm", rollout.pk),
                                {"expected_version": version}, headers=HTMX)

    assert response.status_code == 200
    assert is_partial(text(response).split('<div id="flash"')[0], "rollout")
    assert f"Rollout {rollout.pk} confirmed: wave 1 has it now." in flash(text(response))
    assert rollout_state(rollout) == ("running", version + 1, 1)
    assert set(RolloutTarget.objects.filter(rollout=rollout).values_list("state", flat=True)
               ) == {"activated"}


def test_confirm_as_a_plain_form_redirects_to_the_page_with_the_message(rollout, candidate,
                                                                        nodes, as_deployer):
    ack(nodes[0], candidate)

    response = as_deployer.post(url("rollout-confirm", rollout.pk),
                                {"expected_version": rollout.version})

    assert response["Location"] == url("environment")
    assert "confirmed" in flash(follow_page(as_deployer, response))
    assert Rollout.objects.get(pk=rollout.pk).current_wave == 1


@pytest.mark.parametrize("action", ["rollout-confirm", "rollout-rollback"])
def test_a_stale_expected_version_is_409_saying_it_changed_and_changes_nothing(
        action, rollout, candidate, nodes, as_deployer):
    ack(nodes[0], candidate)
    before, state = stored(), rollout_state(rollout)

    response = as_deployer.post(url(action, rollout.pk),
                                {"expected_version": rollout.version + 1}, headers=HTMX)

    assert response.status_code == 409
    message = flash(text(response))
    assert "changed since you loaded it" in message
    assert "Nothing was done" in message
    assert rollout_state(rollout) == state
    assert stored() == before
    # The panel it answers with shows the current version to try again with.
    assert f'name="expected_version" value="{rollout.version}"' in text(response)


def test_rollback_rolls_the_rollout_back_to_a_new_snapshot(rollout, nodes, second,
                                                           as_deployer):
    response = as_deployer.post(url("rollout-rollback", rollout.pk),
                                {"expected_version": rollout.version}, headers=HTMX)

    assert response.status_code == 200
    assert f"Rollout {rollout.pk} rolled back." in flash(text(response))
    rolled = Rollout.objects.get(pk=rollout.pk)
    assert (rolled.state, rolled.version) == ("rolled_back", rollout.version + 1)
    replacement = rolled.rollback_snapshot
    assert (replacement.number, replacement.rolled_back_from) == (4, second)
    assert replacement.files == second.files
    # Every pin is released, the pending targets' too: no agent is stranded.
    assert dict(Agent.objects.values_list("name", "pin_rollout")) == {
        "web-1": None, "web-2": None, "web-3": None}
    assert "rolled back as <span class=\"snap\">#4</span>" in text(response)


def test_release_pins_button_frees_a_rolled_back_rollouts_kept_pins(rollout, nodes,
                                                                     environment, superuser,
                                                                     as_deployer, as_viewer):
    environment_update(environment=environment, keep_rollout_pins=True, actor=superuser)
    rollout_services.rollout_rollback(rollout=rollout, expected_version=rollout.version,
                                      actor=superuser)
    version = Rollout.objects.get(pk=rollout.pk).version
    panel = text(as_viewer.get(url("environment") + "?panel=rollout", headers=HTMX))
    assert "2 agents still held by this rollout" in panel
    assert "Release remaining pins" not in panel  # a viewer gets no button
    assert "Release remaining pins" in text(
        as_deployer.get(url("environment") + "?panel=rollout", headers=HTMX))

    stale = as_deployer.post(url("rollout-release-pins", rollout.pk),
                             {"expected_version": version - 1}, headers=HTMX)
    response = as_deployer.post(url("rollout-release-pins", rollout.pk),
                                {"expected_version": version}, headers=HTMX)

    assert stale.status_code == 409
    assert response.status_code == 200
    assert f"Rollout {rollout.pk} released its remaining pins." in flash(text(response))
    assert not Agent.objects.filter(pin_rollout=rollout.pk).exists()


def test_confirm_before_the_canary_acknowledged_is_409_with_the_reason(rollout, as_deployer):
    before, state = stored(), rollout_state(rollout)

    response = as_deployer.post(url("rollout-confirm", rollout.pk),
                                {"expected_version": rollout.version}, headers=HTMX)

    assert response.status_code == 409
    assert ("The wave cannot be confirmed: not yet acknowledged (fresh and exact): web-1."
            in flash(text(response)))
    assert (rollout_state(rollout), stored()) == (state, before)


@pytest.mark.parametrize("action", ["rollout-confirm", "rollout-rollback"])
def test_a_missing_expected_version_is_400(action, rollout, as_deployer):
    state = rollout_state(rollout)

    response = as_deployer.post(url(action, rollout.pk), {}, headers=HTMX)

    assert response.status_code == 400
    assert "expected_version: reload the page and try again." in flash(text(response))
    assert rollout_state(rollout) == state


def test_a_rollout_of_another_environment_is_404_through_this_one(rollout, application,
                                                                  superuser, as_deployer):
    staged_environment(application, "staging", superuser)

    response = as_deployer.post(url("rollout-confirm", rollout.pk, env=("shop", "staging")),
                                {"expected_version": rollout.version})

    assert response.status_code == 404
    assert as_deployer.post(url("rollout-rollback", 999999),
                            {"expected_version": 1}).status_code == 404


def test_confirm_and_rollback_are_post_only(rollout, as_deployer):
    assert as_deployer.get(url("rollout-confirm", rollout.pk)).status_code == 405
    assert as_deployer.get(url("rollout-rollback", rollout.pk)).status_code == 405


@pytest.mark.parametrize(("path", "panel"), [("/", "environments"),
                                             ("/e/shop/prod/", "agents")])
def test_the_overview_and_the_agents_table_refresh_every_60_seconds_on_their_own(
        path, panel, second, as_viewer):
    # An agent going offline is an absence of polls, which sends no live event.
    html = text(as_viewer.get(path))

    live_panel = re.search(rf'<div class="live-panel" id="{panel}-panel"[^>]*>', html)
    trigger = re.search(r'hx-trigger="([^"]*)"', live_panel.group(0)).group(1)
    assert re.search(r"\bevery 60s\b", trigger), trigger


# --- query counts -----------------------------------------------------------------------


def _mixed_fleet(environment, count: int, first: Snapshot, second: Snapshot, actor) -> None:
    """`count` agents in every state a row can show: in sync, behind, failed, manual
    with a pushed target, pinned by an operator, never seen."""
    for index, node in enumerate(enrolled_agents(environment, count, prefix="node")):
        kind = index % 6
        if kind == 0:
            ack(node, second)
        elif kind == 1:
            ack(node, first)
        elif kind == 2:
            ack(node, first)
            ack(node, second, status="failed")
        elif kind == 3:
            fleet_services.agent_update(agent=node.agent, actor=actor, mode="manual")
        elif kind == 4:
            releases.agent_pin(agent=node.agent, snapshot=second, actor=actor,
                                     expected_generation=node.fresh().generation)
        if kind != 5:
            poll(node.client)


# Session, user, environments (with their pending-change counts), agents (with
# their desired snapshots), active rollouts. The same for 3 agents as for 30, and
# for 1 environment as for 6.
OVERVIEW_QUERIES = 5
# Session, user, environment, its owners and the user's membership (the role), the
# agents (with their desired and pinned snapshots), their total, whether any is
# pinned.
AGENTS_PANEL_QUERIES = 8


@pytest.mark.parametrize("count", [3, 30])
def test_overview_query_count_does_not_grow_with_the_agents(count, environment, first,
                                                            second, superuser, viewer,
                                                            django_assert_num_queries):
    _mixed_fleet(environment, count, first, second, superuser)
    client = session_client(viewer)

    with django_assert_num_queries(OVERVIEW_QUERIES):
        response = client.get("/", headers=HTMX)

    assert response.status_code == 200
    assert sum(_fleet_buckets(text(response)).values()) == count


@pytest.mark.parametrize("extra", [0, 5])
def test_overview_query_count_does_not_grow_with_the_environments(
        extra, environment, first, superuser, application, viewer, django_assert_num_queries):
    for index in range(extra):
        other = environment_create(application=application, name=f"edge-{index}",
                                   config=CONFIG, actor=superuser)
        publish(other, superuser)
        environment_update(environment=other, config=CONFIG + "# changed\n", actor=superuser)
    client = session_client(viewer)

    with django_assert_num_queries(OVERVIEW_QUERIES):
        response = client.get("/", headers=HTMX)

    assert response.status_code == 200
    assert text(response).count("1 change waiting to roll out") == extra


@pytest.mark.parametrize("count", [3, 30])
def test_agents_panel_query_count_does_not_grow_with_the_agents(count, environment, first,
                                                                second, superuser, deployer,
                                                                django_assert_num_queries):
    _mixed_fleet(environment, count, first, second, superuser)
    client = session_client(deployer)

    with django_assert_num_queries(AGENTS_PANEL_QUERIES):
        response = client.get(url("environment") + "?panel=agents", headers=HTMX)

    assert response.status_code == 200
    assert text(response).count('<tr id="agent-') == count
    pinned = len([i for i in range(count) if i % 6 == 4])  # pinned by an operator
    assert text(response).count(">Deploy now</button>") == count - pinned


# --- hostile numbers and history restores --------------------------------------------

# Every number a page posts: (method, path, data with `junk` in it, the field). The
# rollout's fields are shown by the field, the buttons' hidden ones in the flash. (The
# diff's two numbers: test_diff_with_junk_numbers_is_400_with_the_error_by_the_field.)
NUMBER_FIELDS = {
    "deploy agent": lambda r, junk: ("post", url("deploy"), {"agent": junk}, "agent"),
    "deploy snapshot": lambda r, junk: ("post", url("deploy"), {"snapshot": junk}, "snapshot"),
    "rollout snapshot": lambda r, junk: ("post", url("rollout-new"),
                                         {"snapshot": junk, "canary": ["1"]}, "snapshot"),
    "rollout canary": lambda r, junk: ("post", url("rollout-new"),
                                       {"snapshot": "3", "canary": ["1", junk]}, "canary"),
    "rollout waves": lambda r, junk: ("post", url("rollout-new"), {
        "snapshot": "3", "canary": ["1"], "waves": f"50, {junk}"}, "waves"),
    "confirm version": lambda r, junk: ("post", url("rollout-confirm", r.pk),
                                        {"expected_version": junk}, "expected_version"),
    "rollback version": lambda r, junk: ("post", url("rollout-rollback", r.pk),
                                         {"expected_version": junk}, "expected_version"),
}


@pytest.mark.parametrize("field", list(NUMBER_FIELDS))
def test_a_junk_number_in_any_field_is_400_naming_the_field_never_a_server_error(
        field, rollout, as_deployer, subtests):
    before, state = stored(), rollout_state(rollout)
    for index, junk in enumerate(JUNK_NUMBERS):
        method, path, data, name = NUMBER_FIELDS[field](rollout, junk)
        if field == "rollout waves" and junk == " 2":
            data["waves"] = "50, 2 2"  # spaces around a percentage are fine, inside it not
        with subtests.test(f"junk {index}: {junk!r}"):
            response = getattr(as_deployer, method)(path, data, headers=HTMX)

            assert response.status_code == 400
            html = text(response)
            assert field_errors(html, name) or re.search(
                rf'<p class="msg error">{name}: [^<]+</p>', flash(html)), html[:2000]
            assert (stored(), rollout_state(rollout)) == (before, state)


def test_deploy_to_an_agent_id_beyond_64_bits_is_refused_not_a_server_error(second, nodes,
                                                                           as_deployer):
    response = as_deployer.post(url("deploy"), {"agent": str(2**63)}, headers=HTMX)

    assert response.status_code == 400
    assert "agent: not an agent id." in flash(text(response))
    assert not Deployment.objects.exists()


def test_deploy_to_the_largest_64_bit_agent_id_is_looked_up(second, nodes, as_deployer):
    response = as_deployer.post(url("deploy"), {"agent": str(2**63 - 1)}, headers=HTMX)

    assert response.status_code == 400
    assert not Deployment.objects.exists()


@pytest.mark.parametrize("path", ["/e/shop/prod/snapshots/{huge}/rollback/",
                                  "/e/shop/prod/rollouts/{huge}/confirm/",
                                  "/e/shop/prod/rollouts/{huge}/rollback/"])
@pytest.mark.parametrize("method", ["get", "post"])
def test_a_huge_number_in_a_path_is_404_not_a_server_error(path, method, second,
                                                          as_deployer):
    response = getattr(as_deployer, method)(path.format(huge="9" * 30),
                                            {"expected_version": "1"})

    assert response.status_code == (405 if method == "get" and "rollouts" in path else 404)


@pytest.mark.parametrize("query", ["", "?to=2&from=1"])
def test_an_htmx_history_restore_of_the_diff_page_gets_the_whole_page(query, second,
                                                                      as_viewer):
    response = as_viewer.get(url("diff") + query,
                             headers={**HTMX, "HX-History-Restore-Request": "true"})

    assert response.status_code == 200
    assert "<html" in text(response) and '<select name="to"' in text(response)


def test_the_overview_counts_each_agent_as_its_row_in_the_agents_table_shows_it(
        environment, first, second, superuser, viewer):
    """The overview computes sync in SQL (apps.fleet.selectors.with_sync); the table
    with agent_status in Python: the same rule, so the same buckets."""
    _mixed_fleet(environment, 12, first, second, superuser)
    client = session_client(viewer)

    overview = _fleet_buckets(text(client.get("/", headers=HTMX)))
    table = text(client.get(url("environment") + "?panel=agents", headers=HTMX))
    rows = re.findall(r'<td class="sync"><span class="badge (\w+)">', table)

    labels = {"in_sync": "in sync", "held": "held", "behind": "behind", "failed": "failed",
              "offline": "offline"}
    assert overview == {labels[b]: rows.count(b) for b in labels}
    assert len(rows) == 12 and len([b for b in labels if rows.count(b)]) >= 3


def test_agents_pinned_by_an_operator_offer_no_push_it_would_refuse(
        second, nodes, superuser, as_deployer):
    releases.agent_pin(agent=nodes[0].agent, snapshot=second, actor=superuser,
                             expected_generation=nodes[0].fresh().generation)

    html = text(as_deployer.get(url("environment")))

    assert "Deploy #2 to all now" not in html  # the push to all would be refused
    assert str(nodes[0].agent.pk) not in re.findall(r'name="agent" value="(\d+)"', html)
    assert html.count(">Deploy now</button>") == len(nodes) - 1
