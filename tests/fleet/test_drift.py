"""POST /api/v1/agent/drift: hand-edited managed files as an agent reports them, shown in
its status, filtered with ?drifted=1, audited when the drift starts, changes or clears,
and cleared by a successful apply."""

import pytest

from apps.audit.models import AuditEvent
from apps.environments.services import environment_file_put
from apps.fleet import drift as drift_service
from apps.fleet.models import Agent
from tests.api_helpers import assert_error
from tests.factories import bearer_client, enrolled_agent, publish_variant
from tests.fleet.support import AGENTS, agent_url, report

DRIFT = "/api/v1/agent/drift"
EDITED = [{"path": "nginx/shop.conf", "change": "modified", "summary": "+3 -1 lines"}]


def drift(client, snapshot, files=EDITED, restored=None, checksum=None):
    body = {"snapshot": snapshot.number, "files": files,
            "checksum": snapshot.checksum if checksum is None else checksum}
    if restored is not None:
        body["restored"] = restored
    return client.post(DRIFT, body, format="json")


def _drift_events(agent) -> list:
    return list(AuditEvent.objects.filter(action="agent.drift", object_id=str(agent.pk))
                .order_by("id"))


def _stored(agent) -> tuple:
    fresh = Agent.objects.get(pk=agent.pk)
    return fresh.drift, fresh.drift_seen_at, fresh.drift_restored


@pytest.fixture
def applied(enroll, first):
    """An agent that reported #1 applied."""
    agent = enroll()
    assert report(agent.client, first).status_code == 201
    return agent


def test_drift_is_recorded_shown_in_the_status_and_audited(applied, first, client_for):
    response = drift(applied.client, first)

    assert response.status_code == 200, response.content
    assert response.json() == {"recorded": True, "drifted": 1}
    status = client_for("viewer").get(agent_url(applied.pk)).json()["status"]
    assert status["drift"]["files"] == EDITED
    assert (status["drift"]["restored"], status["drift"]["seen_at"] is not None) == (False, True)
    assert status["sync"] == "in_sync"  # drift is not a sync state: it applied #1
    [event] = _drift_events(applied)
    assert event.data == {"snapshot": 1, "restored": False, "paths": ["nginx/shop.conf"],
                          "files": 1}
    assert event.actor_name == "system" and "nginx/shop.conf" in event.summary


def test_an_identical_repeat_records_and_audits_nothing(applied, first):
    drift(applied.client, first)
    before = _stored(applied)

    response = drift(applied.client, first)

    assert (response.status_code, response.json()["recorded"]) == (200, False)
    assert _stored(applied) == before
    assert len(_drift_events(applied)) == 1


def test_a_changed_set_is_recorded_and_audited_again(applied, first):
    drift(applied.client, first)
    more = [*EDITED, {"path": "shop/app.json", "change": "missing", "summary": ""}]

    response = drift(applied.client, first, files=more)

    assert response.json() == {"recorded": True, "drifted": 2}
    assert _stored(applied)[0] == more
    assert [e.data["paths"] for e in _drift_events(applied)] == [
        ["nginx/shop.conf"], ["nginx/shop.conf", "shop/app.json"]]


def test_an_empty_list_clears_the_drift_once(applied, first, client_for):
    drift(applied.client, first)

    cleared = drift(applied.client, first, files=[])
    again = drift(applied.client, first, files=[])

    assert cleared.json() == {"recorded": True, "drifted": 0}
    assert again.json() == {"recorded": False, "drifted": 0}
    assert _stored(applied) == ([], None, False)
    assert client_for("viewer").get(agent_url(applied.pk)).json()["status"]["drift"] is None
    assert [e.data["paths"] for e in _drift_events(applied)] == [["nginx/shop.conf"], []]


def test_no_drift_reported_on_a_clean_agent_records_nothing(applied, first):
    response = drift(applied.client, first, files=[])

    assert response.json() == {"recorded": False, "drifted": 0}
    assert _drift_events(applied) == []


def test_a_restored_drift_is_shown_restored_and_not_listed_as_drifted(applied, first,
                                                                       client_for):
    drift(applied.client, first)
    restored = drift(applied.client, first, restored=True)

    assert restored.json()["recorded"] is True
    viewer = client_for("viewer")
    assert viewer.get(agent_url(applied.pk)).json()["status"]["drift"]["restored"] is True
    assert viewer.get(f"{AGENTS}?drifted=1").json()["results"] == []
    assert [a["id"] for a in viewer.get(f"{AGENTS}?drifted=0").json()["results"]] == [
        applied.pk]
    assert _drift_events(applied)[-1].data["restored"] is True


def test_a_successful_apply_report_clears_the_drift(applied, first, environment, superuser):
    drift(applied.client, first)
    second = publish_variant(environment, superuser, workers=9)

    assert report(applied.client, second).status_code == 201

    assert _stored(applied) == ([], None, False)


def test_a_failed_apply_report_keeps_the_drift(applied, first, environment, superuser):
    drift(applied.client, first)
    second = publish_variant(environment, superuser, workers=9)

    report(applied.client, second, status="failed", message="reload failed")

    assert _stored(applied)[0] == EDITED


def test_the_list_filters_drifted_agents(applied, first, enroll, client_for):
    clean = enroll("web-2")
    drift(applied.client, first)
    viewer = client_for("viewer")

    drifted = viewer.get(f"{AGENTS}?drifted=1").json()["results"]
    others = viewer.get(f"{AGENTS}?drifted=0").json()["results"]

    assert [(a["id"], a["status"]["drift"]["files"]) for a in drifted] == [
        (applied.pk, EDITED)]
    assert [a["id"] for a in others] == [clean.pk]


@pytest.mark.parametrize("value", ["maybe", "2", "TRUE", "", "\uff11", "1&drifted=1"])
def test_a_bad_drifted_filter_is_400_naming_it(value, applied, client_for):
    error = assert_error(client_for("viewer").get(f"{AGENTS}?drifted={value}"), 400)

    assert error["details"][0]["field"] == "drifted"


# -- refusals -------------------------------------------------------------------------------


def test_drift_of_another_snapshot_than_the_applied_one_is_409(applied, first, environment,
                                                               superuser):
    second = publish_variant(environment, superuser, workers=9)

    error = assert_error(drift(applied.client, second), 409, "not_applied")

    assert error["details"][0]["field"] == "snapshot"
    assert _stored(applied) == ([], None, False)


def test_drift_with_another_checksum_is_409(applied, first):
    assert_error(drift(applied.client, first, checksum="sha256:" + "0" * 64), 409,
                 "not_applied")
    assert _stored(applied) == ([], None, False)


def test_drift_from_an_agent_that_applied_nothing_is_409(enroll, first):
    agent = enroll()

    assert_error(drift(agent.client, first), 409, "not_applied")


def test_drift_needs_an_agent_token(api_client, superuser, applied, first):
    assert_error(drift(api_client(superuser), first), 401)
    assert_error(drift(bearer_client("nope.nope"), first), 401)
    assert _stored(applied) == ([], None, False)


BAD_BODIES = [
    ({"files": "nginx/shop.conf"}, "files"),
    ({"files": [{"path": "a", "change": "edited"}]}, "files"),
    ({"files": [{"path": "a\x00b", "change": "modified"}]}, "files"),
    ({"files": [{"path": "a\u202eb", "change": "modified"}]}, "files"),
    ({"files": [{"path": "", "change": "modified"}]}, "files"),
    ({"files": [{"path": 7, "change": "modified"}]}, "files"),
    ({"files": [{"path": "a", "change": "modified", "summary": "x" * 201}]}, "files"),
    ({"files": [{"path": "a", "change": "modified", "summary": "a\x00"}]}, "files"),
    ({"files": [{"path": "a", "change": "modified"}] * 2}, "files"),
    ({"files": [{"path": f"f{i}", "change": "missing"} for i in range(1001)]}, "files"),
    ({"files": ["a"]}, "files"),
    ({"restored": "maybe"}, "restored"),
    ({"restored": "yes"}, "restored"),
    ({"restored": "true"}, "restored"),
    ({"restored": 1}, "restored"),
    ({"restored": None}, "restored"),
    ({"files": [{"path": "../../etc/passwd", "change": "modified"}]}, "files"),
    ({"files": [{"path": "nginx/other.conf", "change": "modified"}]}, "files"),
    ({"files": [{"path": "nginx/shop.conf" + "/x" * 200, "change": "modified"}]}, "files"),
    ({"snapshot": "one"}, "snapshot"),
    ({"snapshot": 0}, "snapshot"),
    ({"checksum": None}, "checksum"),
    ({"checksum": "x" * 72}, "checksum"),
]


@pytest.mark.parametrize(("change", "field"), BAD_BODIES)
def test_a_bad_drift_report_is_400_naming_the_field_and_changes_nothing(change, field,
                                                                        applied, first):
    body = {"snapshot": 1, "checksum": first.checksum, "files": EDITED, **change}

    error = assert_error(applied.client.post(DRIFT, body, format="json"), 400)

    assert error["details"][0]["field"].split("[")[0].split(".")[0] == field, error
    assert _stored(applied) == ([], None, False)
    assert _drift_events(applied) == []


def test_a_drift_report_that_is_not_an_object_is_400(applied):
    assert_error(applied.client.post(DRIFT, [1, 2], format="json"), 400)
    assert_error(applied.client.post(DRIFT, "x", content_type="text/plain"), 415)


# -- hostile ----------------------------------------------------------------------------------


def test_a_drift_report_changes_only_the_reporting_agents_drift(applied, first, enroll):
    other = enroll("web-2")
    assert report(other.client, first).status_code == 201
    before = {f: getattr(Agent.objects.get(pk=applied.pk), f) for f in (
        "generation", "applied_number", "applied_checksum", "last_status", "mode", "labels",
        "enabled")}

    # web-2's token: whatever the body says, it is web-2's own drift.
    drift(other.client, first)

    assert _stored(applied) == ([], None, False)
    assert _stored(other)[0] == EDITED
    after = Agent.objects.get(pk=applied.pk)
    assert {f: getattr(after, f) for f in before} == before
    assert Agent.objects.get(pk=other.pk).generation == other.agent.generation


def test_an_agent_of_another_environment_cannot_report_drift_of_this_one(
        applied, first, blog, superuser):
    stranger = enrolled_agent(blog, "blog-1", actor=superuser)

    assert_error(drift(stranger.client, first), 409, "not_applied")

    assert _stored(applied) == ([], None, False)
    assert _stored(stranger.agent) == ([], None, False)


def test_a_drift_report_changes_no_desired_state(applied, first):
    before = Agent.objects.get(pk=applied.pk).generation

    drift(applied.client, first)

    assert Agent.objects.get(pk=applied.pk).generation == before


def test_a_decommissioned_agent_cannot_report_drift(applied, first, superuser):
    from apps.releases.services import agent_decommission

    agent_decommission(agent=applied.agent, expected_generation=applied.fresh().generation,
                       actor=superuser)

    assert_error(drift(applied.client, first), 401)
    assert _stored(applied) == ([], None, False)


SECOND = {"path": "shop/app.json", "change": "missing"}


@pytest.mark.parametrize(("files", "field"), [
    ([*EDITED, {"path": "../../etc/passwd", "change": "modified"}], "files[1].path"),
    ([SECOND, {"path": "/etc/shadow", "change": "missing"}], "files[1].path"),
    ([*EDITED, SECOND, {"path": "shop/app.json", "change": "mode"}], "files[2].path"),
    ([*EDITED, SECOND, {**SECOND, "change": "edited"}], "files[2].change"),
    ([*EDITED, {"path": "x" * 256, "change": "missing"}], "files[1].path"),
    ([*EDITED, {"path": 7, "change": "missing"}], "files[1].path"),
])
def test_every_field_error_names_the_file_by_its_index(files, field, applied, first):
    error = assert_error(drift(applied.client, first, files=files), 400)

    assert [d["field"] for d in error["details"]] == [field], error
    assert _stored(applied) == ([], None, False)
    assert _drift_events(applied) == []


def test_a_path_that_is_not_a_file_of_the_applied_snapshot_is_not_shown(applied, first,
                                                                          client_for):
    error = assert_error(drift(applied.client, first, files=[
        {"path": "../../etc/passwd", "change": "modified", "summary": "root"}]), 400)

    assert "not a file of the applied snapshot" in error["message"]
    status = client_for("viewer").get(agent_url(applied.pk)).json()["status"]
    assert status["drift"] is None


def test_a_path_of_another_snapshot_is_refused(applied, first, environment, superuser):
    environment_file_put(environment=environment, kind="template", path="extra.conf",
                         text="x\n", actor=superuser)
    second = publish_variant(environment, superuser, workers=9)
    assert "extra.conf" in {f["path"] for f in second.files}

    error = assert_error(drift(applied.client, first, files=[
        {"path": "extra.conf", "change": "missing"}]), 400)
    assert error["details"][0]["field"] == "files[0].path"


def test_the_audit_keeps_the_first_paths_and_the_count(applied, first, monkeypatch):
    many = [f"conf/f{i:04}.conf" for i in range(1000)]
    monkeypatch.setattr(drift_service, "_managed_paths", lambda agent, number: set(many))
    for files in (many, many[::-1]):
        assert drift(applied.client, first, files=[
            {"path": p, "change": "missing"} for p in files]).status_code == 200

    events = _drift_events(applied)
    assert [e.data["files"] for e in events] == [1000, 1000]
    assert events[0].data["paths"] == many[:20]
    assert all(len(str(e.data)) + len(e.summary) < 2000 for e in events)
