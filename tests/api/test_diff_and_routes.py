"""Diffs involving invalid snapshots, and unknown API routes in embedded (DEBUG) mode."""

import time

import pytest
from django.test import override_settings

from apps.environments.services import environment_file_put
from tests.api.support import ENV
from tests.api_helpers import assert_error
from tests.factories import publish

BROKEN = "{{ no_such_name }}\n"


@pytest.fixture
def ready_invalid_ready(environment, superuser):
    """#1 ready, #2 invalid, #3 ready (workers 8)."""
    publish(environment, superuser)
    good = environment.templates.get(path="shop/app.json").source
    environment_file_put(environment=environment, kind="template", path="shop/app.json",
                         text=BROKEN, actor=superuser)
    publish(environment, superuser)
    environment_file_put(environment=environment, kind="template", path="shop/app.json",
                         text=good.replace("{{ workers }}", "8"), actor=superuser)
    publish(environment, superuser)


def test_the_default_diff_skips_an_invalid_predecessor(ready_invalid_ready, client_for):
    body = client_for("viewer").get(f"{ENV}/snapshots/3/diff").json()

    assert body["against"] == 1
    assert [(f["path"], f["status"]) for f in body["files"]] == [("shop/app.json", "modified")]


@pytest.mark.parametrize("url", [f"{ENV}/snapshots/2/diff", f"{ENV}/snapshots/3/diff?against=2"])
def test_a_diff_involving_an_invalid_snapshot_is_a_conflict(ready_invalid_ready, client_for,
                                                            url):
    response = client_for("viewer").get(url)

    assert_error(response, 409, "snapshot_invalid")


@override_settings(DEBUG=True)
def test_an_unknown_api_route_answers_the_json_envelope_even_with_debug(api_client, superuser):
    response = api_client(superuser).get("/api/v1/no/such/route")

    assert_error(response, 404, "not_found")


# --- a diff too costly to match line by line -----------------------------------------------

LINES = 8000  # difflib alone: about 9 s for each diff of these two renders


def _list_template(step: str) -> str:
    return "{% for i in range(" + str(LINES) + ") %}" + step + "\n{% endfor %}"


@pytest.fixture
def costly_pair(environment, superuser):
    """#1 renders list.txt as 0..N, #2 as y0, 0, y1, 1... (the quadratic shape for
    line matching); the current inputs render as #2."""
    environment_file_put(environment=environment, kind="template", path="list.txt",
                         text=_list_template("{{ i }}"), actor=superuser)
    publish(environment, superuser)
    environment_file_put(environment=environment, kind="template", path="list.txt",
                         text=_list_template("y{{ i }}\n{{ i }}"), actor=superuser)
    publish(environment, superuser)


def _timed(call):
    started = time.monotonic()
    response = call()
    assert time.monotonic() - started < 4
    return response


def _list_change(files: list[dict]) -> dict:
    [change] = [f for f in files if f["path"] == "list.txt"]
    assert (change["status"], change["too_large"], change["diff"]) == ("modified", True, "")
    assert change["new_bytes"] != change["old_bytes"]
    assert change["old_checksum"].startswith("sha256:")
    return change


def test_a_costly_snapshot_diff_is_bounded_for_a_viewer(costly_pair, client_for):
    response = _timed(lambda: client_for("viewer").get(f"{ENV}/snapshots/2/diff?against=1"))
    assert response.status_code == 200
    _list_change(response.json()["files"])


@pytest.mark.slow  # diffs up to their time bound
def test_a_costly_diff_is_bounded_on_the_dashboard_and_in_pending(costly_pair, client_for,
                                                                  client, superuser,
                                                                  environment):
    environment_file_put(environment=environment, kind="template", path="list.txt",
                         text=_list_template("{{ i }}"), actor=superuser)  # #1's again
    body = _timed(lambda: client_for("viewer").get(f"{ENV}/pending")).json()
    assert body["valid"] is True
    _list_change(body["files"])
    client.force_login(superuser)
    page = _timed(lambda: client.get("/e/shop/prod/diff/", {"from": 1, "to": 2}))
    assert page.status_code == 200
    assert "Too large to show line by line." in page.content.decode()
