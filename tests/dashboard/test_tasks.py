"""The dashboard's whole tasks: the snapshot list (descriptor, identical content,
pages), compare on a meaningful pair with the effective config's change, pending
changes with their diff and Publish, the rollout form's safety fields, the rollout
panel (completed, bars, clocks, failures, pause / resume), the rollout history and
the audit log — each page with its roles (viewer, deployer, outsider: 404) and its
query count pinned."""

import re

import pytest

from apps.dashboard import audit_reads, snapshot_reads
from apps.releases import services as releases
from apps.releases.services import environment_update
from apps.rollouts.models import Rollout
from apps.snapshots.models import Publication
from tests.dashboard.test_views import (
    HTMX,
    MANUAL_WAVES,
    field_errors,
    flash,
    section,
    text,
    url,
)
from tests.factories import (
    CONFIG,
    ack,
    enrolled_agents,
    publish,
    render,
    rollback_publication,
    session_client,
    start_rollout,
)
from tests.rollouts.support import confirm, rollback

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("empty_cache")]

pytest_plugins = []


@pytest.fixture
def second(second_active):
    return second_active


@pytest.fixture
def nodes(environment):
    return enrolled_agents(environment, 3)


@pytest.fixture
def as_viewer(member):
    return session_client(member("viewer"))


@pytest.fixture
def as_deployer(member):
    return session_client(member("deployer"))


@pytest.fixture
def as_outsider(outsider):
    return session_client(outsider)


def staged_third(environment, superuser):
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    environment_update(environment=environment, config=CONFIG.replace("workers: 4",
                                                                      "workers: 16"),
                       actor=superuser)
    return publish(environment, superuser)


# --- pages every viewer sees, no outsider ---------------------------------------------

PAGES = ["snapshots", "rollouts", "audit"]


@pytest.mark.parametrize("page", PAGES)
def test_a_viewer_sees_the_page_an_outsider_gets_404_anonymous_signs_in(
        page, second, as_viewer, as_outsider, client):
    assert as_viewer.get(url(page)).status_code == 200
    assert as_outsider.get(url(page)).status_code == 404
    anonymous = client.get(url(page))
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/login/")


@pytest.mark.parametrize("page", PAGES)
def test_an_htmx_request_gets_the_list_partial_and_junk_pages_are_no_error(
        page, second, as_viewer):
    partial = as_viewer.get(url(page) + "?page=x", headers=HTMX)
    assert partial.status_code == 200
    assert "<html" not in text(partial)
    assert as_viewer.get(url(page) + "?page=99999999999999999999&kind=x").status_code == 200


# --- overview ----------------------------------------------------------------------------


def test_an_agent_that_failed_then_went_offline_still_counts_as_failed(
        environment, first, second, nodes, as_viewer):
    ack(nodes[0], first)
    ack(nodes[0], second, status="failed")  # and it never polls again: offline

    row = re.search(r'<tr data-environment="shop/prod">.*?</tr>', text(as_viewer.get("/")),
                    re.S).group(0)

    assert re.search(r'class="badge failed"[^>]*>1 failed<', row)
    assert re.search(r'class="badge offline"[^>]*>2 offline<', row)
    # Zero counts are greyed, not alarms.
    assert re.search(r'class="badge held zero"[^>]*>0 held<', row)
    assert 'class="badge failed zero"' not in row


def test_an_environment_without_agents_offers_no_deploy_or_rollout(second, as_deployer):
    overview = text(as_deployer.get("/"))
    page = text(as_deployer.get(url("environment")))

    assert "no agents yet" in overview and "0 failed" not in overview
    assert "Start a rollout" not in page and "to all now" not in page
    assert "Submit a descriptor" in page


def test_with_agents_the_deployer_gets_the_rollout_button(second, nodes, as_deployer):
    assert "Start a rollout" in text(as_deployer.get(url("environment")))


# --- snapshots ---------------------------------------------------------------------------


def test_the_snapshot_list_shows_descriptor_author_identical_active_and_pages(
        environment, first, second, superuser, as_viewer, monkeypatch):
    publication, _ = releases.descriptor_submit(environment=environment, actor=superuser,
                                                descriptor={
        "apiVersion": "bellwether/v1", "application": "shop", "environment": "prod",
        "id": "rel-7", "version": "7.0.1"})
    render(publication)
    rollback_publication(first, superuser)  # #4: #1's content again
    monkeypatch.setattr(snapshot_reads, "SNAPSHOTS_PER_PAGE", 3)

    page_one = text(as_viewer.get(url("snapshots")))
    page_two = text(as_viewer.get(url("snapshots") + "?page=2"))

    rows = dict(re.findall(r'<tr id="snapshot-(\d+)">(.*?)</tr>', page_one, re.S))
    assert sorted(rows) == ["2", "3", "4"]
    assert "<code>rel-7</code>" in rows["3"] and "v7.0.1" in rows["3"]
    assert "identical to #1" in rows["4"] and "badge active" in rows["4"]
    assert "rollback to #1" in rows["4"] and "root" in rows["4"]
    assert "page 1 of 2" in page_one and 'rel="next"' in page_one
    assert re.findall(r'<tr id="snapshot-(\d+)">', page_two) == ["1"]


def test_the_environment_page_links_to_every_snapshot_beyond_the_newest(
        environment, first, second, as_viewer, monkeypatch):
    from apps.dashboard import selectors
    monkeypatch.setattr(selectors, "SNAPSHOTS_SHOWN", 1)

    html = section(text(as_viewer.get(url("environment"))), "snapshots")

    assert re.findall(r'<tr id="snapshot-(\d+)">', html) == ["2"]
    assert "All 2 snapshots" in html


# Session, user, environment, owners and membership (the role)... then the page
# (count and rows, the quarantines): the same for 1 snapshot as for 4.
@pytest.mark.parametrize("extra", [0, 3])
def test_the_snapshot_list_query_count_does_not_grow_with_its_length(
        extra, environment, first, superuser, member, django_assert_num_queries):
    for workers in range(extra):
        environment_update(environment=environment,
                           config=CONFIG.replace("workers: 4", f"workers: {20 + workers}"),
                           actor=superuser)
        publish(environment, superuser)
    client = session_client(member("viewer"))
    client.get(url("snapshots"))  # warm the session

    with django_assert_num_queries(SNAPSHOT_LIST_QUERIES):
        response = client.get(url("snapshots"), headers=HTMX)
    assert text(response).count('<tr id="snapshot-') == 1 + extra


SNAPSHOT_LIST_QUERIES = 8


# --- compare -----------------------------------------------------------------------------


def test_compare_opens_on_the_active_snapshot_against_the_one_before(second, as_viewer):
    html = text(as_viewer.get(url("diff")))

    assert "#2 against #1" in html
    assert re.search(r'<option value="2" selected>', html)


def test_compare_opens_on_the_newest_against_the_active_one(environment, second, superuser,
                                                             as_viewer):
    staged_third(environment, superuser)

    assert "#3 against #2" in text(as_viewer.get(url("diff")))


def test_the_compare_page_shows_the_effective_config_change_too(second, as_viewer):
    html = text(as_viewer.get(url("diff") + "?to=2&from=1"))

    assert "the effective config changed" in html
    assert re.search(r'<div class="add">\+workers: 8</div>', html)


def test_a_config_only_change_is_shown_without_any_file_change(environment, first, second):
    """Two snapshots whose files are equal and whose effective configs are not (a
    value no template reads): the config's change is what there is to show."""
    from configlang.diff import diff_files
    second.files = first.files
    assert diff_files(first.files, second.files) == []

    change = snapshot_reads.config_change(second, first.number)

    assert [c["path"] for c in change] == ["effective config"]
    assert "+workers: 8" in change[0]["diff"]


def test_comparing_a_snapshot_with_itself_says_they_hold_the_same(second, as_viewer):
    html = text(as_viewer.get(url("diff") + "?to=2&from=2"))
    assert "The two snapshots hold the same content." in html


# --- pending changes -----------------------------------------------------------------------


def test_pending_changes_show_their_diff_and_a_deployer_publishes_them(
        environment, first, superuser, as_deployer, as_viewer):
    environment_update(environment=environment, config=CONFIG.replace("workers: 4",
                                                                      "workers: 6"),
                       actor=superuser)

    viewer_panel = text(as_viewer.get(url("environment") + "?panel=pending", headers=HTMX))
    panel = text(as_deployer.get(url("environment") + "?panel=pending", headers=HTMX))

    assert "Against the active #1" in panel and '<div class="add">' in panel
    assert "Publish 1 change" in panel and "Publish 1 change" not in viewer_panel
    response = as_deployer.post(url("publish"), headers=HTMX)
    assert response.status_code == 200
    assert Publication.objects.filter(environment=environment).count() == 2
    assert "Publishing the pending changes" in flash(text(response))


def test_a_viewer_or_outsider_cannot_publish(environment, first, superuser, as_viewer,
                                             as_outsider):
    before = Publication.objects.count()

    assert as_viewer.post(url("publish"), headers=HTMX).status_code == 403
    assert as_outsider.post(url("publish")).status_code == 404
    assert as_viewer.get(url("publish")).status_code == 405
    assert Publication.objects.count() == before


# --- the rollout form ------------------------------------------------------------------------


def test_a_rollout_with_canaries_by_label_and_percent_and_its_safety_settings(
        environment, second, superuser, as_deployer):
    enrolled_agents(environment, 2, prefix="eu", labels={"zone": "eu"})
    enrolled_agents(environment, 4, prefix="us", labels={"zone": "us"})
    staged_third(environment, superuser)

    response = as_deployer.post(url("rollout-new"), {
        "snapshot": "3", "canary_labels": "zone=eu", "canary_percent": "20", "waves": "100",
        "gate": "auto", "bake_s": "120", "failure_threshold": "1", "wave_timeout_s": "900"})

    assert response.status_code == 302, text(response)[:3000]
    started = Rollout.objects.get()
    canaries = set(started.targets.filter(wave=0).values_list("agent__name", flat=True))
    assert canaries == {"eu-1", "eu-2"}  # the first 20% by name are eu-1, eu-2 too
    assert (started.failure_threshold, started.wave_timeout_s) == (1, 900)
    assert [w["bake_s"] for w in started.waves] == [120, 120]


@pytest.mark.parametrize(("data", "field", "message"), [
    ({"canary_labels": "zone"}, "canary_labels", "labels as key=value, separated by commas."),
    ({"canary_percent": "0"}, "canary_percent", "a percentage from 1 to 100."),
    ({"bake_s": "-1"}, "bake_s", "seconds, from 0 to 604800."),
    ({"failure_threshold": "x"}, "failure_threshold", "a number of agents, from 0 to 100000."),
    ({"wave_timeout_s": "59"}, "wave_timeout_s", "seconds, from 60 to 604800."),
    ({"canary_labels": "zone=mars"}, "canary", "The canary wave would be empty."),
])
def test_bad_safety_settings_are_400_by_their_field_and_every_value_is_kept(
        data, field, message, environment, second, nodes, superuser, as_deployer):
    staged_third(environment, superuser)
    sent = {"snapshot": "3", "canary": [str(nodes[0].pk)], "bake_s": "30",
            "failure_threshold": "2", "wave_timeout_s": "600", **data}
    if field == "canary":
        sent.pop("canary")

    response = as_deployer.post(url("rollout-new"), sent)

    assert response.status_code == 400
    html = text(response)
    assert field_errors(html, field) == [message]
    for name in ("bake_s", "failure_threshold", "wave_timeout_s", "canary_labels"):
        if name in sent:
            assert re.search(rf'name="{name}" value="{re.escape(sent[name])}"', html), name
    assert not Rollout.objects.exists()


# --- the rollout panel, pause and resume -----------------------------------------------------


@pytest.fixture
def running(environment, second, nodes, superuser):
    third = staged_third(environment, superuser)
    return start_rollout(environment, third, [nodes[0]], waves=MANUAL_WAVES), third


def rollout_panel(client) -> str:
    return text(client.get(url("environment") + "?panel=rollout", headers=HTMX))


def test_the_panel_shows_activated_and_acknowledged_bars_and_the_waves_clock(
        running, nodes, as_viewer):
    rollout, third = running
    ack(nodes[0], third)

    html = rollout_panel(as_viewer)

    assert '<progress class="activated" max="1" value="1"' in html
    assert '<progress class="acknowledged" max="1" value="1"' in html
    assert '<progress class="acknowledged" max="2" value="0"' in html
    assert "Wave waiting since" in html and "pauses at" in html


def test_a_completed_rollout_reads_as_completed_with_full_bars(running, nodes, as_deployer):
    rollout, third = running
    ack(nodes[0], third)
    confirm(rollout)
    for node in nodes[1:]:
        ack(node, third)
    version = Rollout.objects.get(pk=rollout.pk).version

    response = as_deployer.post(url("rollout-confirm", rollout.pk),
                                {"expected_version": version}, headers=HTMX)

    html = text(response)
    assert "confirmed and completed: #3 is active" in flash(html)
    assert "every wave has it; #3 is active" in html
    assert '<progress class="activated" max="2" value="2"' in html
    assert '<progress class="acknowledged" max="2" value="2"' in html
    assert "Confirm" not in html and "Pause" not in html


def test_a_rollout_rolled_back_on_failures_names_the_agents_and_what_they_said(
        running, nodes, as_viewer):
    rollout, third = running
    said = "#3 failed (validate exited 1: bad: <broken> marker found); nothing was changed"
    ack(nodes[0], third, status="failed", message=said)
    assert "web-1</strong> failed: <span class=\"message\">#3 failed (validate exited 1: " \
           "bad: &lt;broken&gt; marker" in rollout_panel(as_viewer)  # while it runs
    rollback(rollout, reason="more than 0 target(s) failed")

    html = rollout_panel(as_viewer)

    assert ('<ul class="bad failed-agents"><li><strong>web-1</strong> failed: '
            '<span class="message">#3 failed (validate exited 1: bad: &lt;broken&gt; marker '
            'found); nothing was changed</span></li></ul>') in html


def test_a_deployer_pauses_and_resumes_from_the_panel(running, as_deployer, as_viewer,
                                                       as_outsider):
    rollout, _ = running
    assert "Pause</button>" in rollout_panel(as_deployer)
    assert "Pause</button>" not in rollout_panel(as_viewer)

    assert as_viewer.post(url("rollout-pause", rollout.pk), {"expected_version": 1},
                          headers=HTMX).status_code == 403
    assert as_outsider.post(url("rollout-pause", rollout.pk),
                            {"expected_version": 1}).status_code == 404
    stale = as_deployer.post(url("rollout-pause", rollout.pk), {"expected_version": 9},
                             headers=HTMX)
    assert stale.status_code == 409 and "changed since you loaded it" in flash(text(stale))
    assert Rollout.objects.get(pk=rollout.pk).state == "running"

    paused = as_deployer.post(url("rollout-pause", rollout.pk), {"expected_version": 1},
                              headers=HTMX)
    assert paused.status_code == 200 and "Resume</button>" in text(paused)
    assert Rollout.objects.get(pk=rollout.pk).state == "paused"
    resumed = as_deployer.post(url("rollout-resume", rollout.pk), {"expected_version": 2})
    assert resumed.status_code == 302
    assert Rollout.objects.get(pk=rollout.pk).state == "running"


# --- rollout history and audit ---------------------------------------------------------------


def test_the_rollout_history_has_each_rollouts_timeline(running, nodes, as_viewer):
    rollout, third = running
    rollback(rollout, reason="bad canary")

    html = text(as_viewer.get(url("rollouts")))

    entry = re.search(rf'<article class="panel rollout-entry" id="rollout-{rollout.pk}">'
                      r".*?</article>", html, re.S).group(0)
    assert re.findall(r'<li data-action="([\w.]+)"', entry) == ["rollout.create",
                                                                "rollout.rollback"]
    assert "bad canary" in entry


ROLLOUT_HISTORY_QUERIES = 8


@pytest.mark.parametrize("count", [1, 2])
def test_the_rollout_history_query_count_does_not_grow_with_the_rollouts(
        count, environment, second, nodes, superuser, member, django_assert_num_queries):
    environment_update(environment=environment, release_policy="staged", actor=superuser)
    for index in range(count):
        environment_update(environment=environment, config=CONFIG.replace(
            "workers: 4", f"workers: {30 + index}"), actor=superuser)
        staged = publish(environment, superuser)
        rollback(start_rollout(environment, staged, [nodes[0]], waves=MANUAL_WAVES))
    client = session_client(member("viewer"))
    client.get(url("rollouts"))

    with django_assert_num_queries(ROLLOUT_HISTORY_QUERIES):
        html = text(client.get(url("rollouts"), headers=HTMX))
    assert html.count('class="panel rollout-entry"') == count


def test_the_audit_log_filters_by_kind_and_pages(environment, second, superuser, as_viewer,
                                                 monkeypatch):
    monkeypatch.setattr(audit_reads, "EVENTS_PER_PAGE", 1)

    snapshots = text(as_viewer.get(url("audit") + "?kind=snapshot"))
    everything = text(as_viewer.get(url("audit") + "?kind=bogus"))

    actions = re.findall(r'<tr class="event" data-action="([\w.]+)"', snapshots)
    assert actions and all(a.startswith("snapshot.") for a in actions)
    assert "kind=snapshot&amp;page=2" in snapshots
    assert '<option value="snapshot" selected>' in snapshots
    assert len(re.findall(r'<tr class="event"', everything)) == 1
    assert '<option value="" selected>' not in everything  # nothing chosen: every kind


AUDIT_QUERIES = 7


@pytest.mark.parametrize("extra", [0, 4])
def test_the_audit_log_query_count_does_not_grow_with_the_events(
        extra, environment, first, superuser, member, django_assert_num_queries):
    for index in range(extra):
        environment_update(environment=environment, config=CONFIG + f"k{index}: 1\n",
                           actor=superuser)
    client = session_client(member("viewer"))
    client.get(url("audit"))

    with django_assert_num_queries(AUDIT_QUERIES):
        client.get(url("audit"), headers=HTMX)
