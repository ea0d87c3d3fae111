"""Diffs involving invalid snapshots, and unknown API routes in embedded (DEBUG) mode."""

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
