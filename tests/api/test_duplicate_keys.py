"""A JSON body giving one key twice is refused naming the key, on every JSON route
(the one parser, apps.core.parsers.BoundedJSONParser), and nothing changes."""

import pytest

from tests.api.support import ENV
from tests.api_helpers import assert_error


@pytest.mark.parametrize(("body", "key"), [
    ('{"poll_interval_s": 60, "poll_interval_s": 7}', "poll_interval_s"),
    ('{"config_schema": {"type": "object", "type": "string"}}', "type"),
    ('{"poll_interval_s": 60, "x": [{"a": 1, "a": 2}]}', "a"),
    ('{"p\\u006fll_interval_s": 60, "poll_interval_s": 7}', "poll_interval_s"),
])
def test_a_duplicate_key_is_refused_naming_it(environment, client_for, body, key):
    response = client_for("owner").generic("PATCH", ENV, body,
                                           content_type="application/json")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == key
    environment.refresh_from_db()
    assert environment.poll_interval_s == 30


def test_a_duplicate_key_in_another_routes_body_is_refused(environment, client_for):
    response = client_for("owner").generic(
        "POST", f"{ENV}/enrollment-tokens", '{"uses": 1, "uses": 100000}',
        content_type="application/json")

    error = assert_error(response, 400, "invalid")
    assert error["details"][0]["field"] == "uses"


def test_distinct_keys_pass(environment, client_for):
    response = client_for("owner").generic("PATCH", ENV, '{"poll_interval_s": 60}',
                                           content_type="application/json")

    assert response.status_code == 200
