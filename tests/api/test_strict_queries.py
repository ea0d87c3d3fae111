"""Query parameters and body numbers are read strictly: a flag in its documented
spellings, a number in ASCII digits, each parameter once, and no unknown parameter
on an unsafe request — anything else is 400 naming it, and nothing is done."""

import pytest

from apps.core.text import whole_number
from tests.api.support import ENV
from tests.api.test_descriptors import URL, descriptor, layered, stored  # noqa: F401
from tests.api_helpers import assert_error
from tests.factories import publish

NOT_A_FLAG = ["maybe", "+1", "\uff11", "TRUE", "True", "1 ", " 1", "on", "2", "",
              "\u0661", "tru"]


@pytest.fixture
def deployer(client_for):
    return client_for("deployer")


def assert_refused_naming(response, name: str):
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert name in error["message"]
    assert error["details"][0]["field"] == name


@pytest.mark.parametrize("value", NOT_A_FLAG)
def test_a_dry_run_that_is_not_a_flag_is_refused_and_publishes_nothing(
        layered, deployer, value):  # noqa: F811
    before = stored()

    response = deployer.post(f"{URL}?dry_run={value}", descriptor(), format="json")

    assert_refused_naming(response, "dry_run")
    assert stored() == before


@pytest.mark.parametrize("query", ["dry_run=1&dry_run=0", "dry_run=0&dry_run=1",
                                   "dry_run=1&dry_run=1"])
def test_a_repeated_dry_run_is_refused(layered, deployer, query):  # noqa: F811
    before = stored()

    response = deployer.post(f"{URL}?{query}", descriptor(), format="json")

    assert_refused_naming(response, "dry_run")
    assert stored() == before


@pytest.mark.parametrize("query", ["DRY_RUN=1", "dryrun=1", "dry-run=1", "dry_run%20=1",
                                   "force=1"])
def test_an_unknown_parameter_of_an_unsafe_request_is_refused(
        layered, deployer, query):  # noqa: F811
    before = stored()

    response = deployer.post(f"{URL}?{query}", descriptor(), format="json")

    assert response.status_code == 400, response.content
    assert response.json()["error"]["details"][0]["field"] == query.split("=")[0].replace(
        "%20", " ")
    assert stored() == before


@pytest.mark.parametrize("route", [f"{ENV}/publish", f"{ENV}/reset-inputs"])
def test_every_unsafe_route_refuses_a_parameter_it_does_not_read(
        environment, client_for, route):
    response = client_for("owner").post(f"{route}?dry_run=1", {}, format="json")

    assert_refused_naming(response, "dry_run")


def test_patch_refuses_an_unknown_parameter_and_changes_nothing(environment, client_for):
    response = client_for("owner").patch(f"{ENV}?validate_only=1", {"poll_interval_s": 60},
                                         format="json")

    assert_refused_naming(response, "validate_only")
    environment.refresh_from_db()
    assert environment.poll_interval_s == 30


@pytest.mark.parametrize("spelling", ["1", "true", "yes"])
def test_the_documented_spellings_are_a_dry_run(layered, deployer, spelling):  # noqa: F811
    before = stored()

    response = deployer.post(f"{URL}?dry_run={spelling}", descriptor(), format="json")

    assert response.status_code == 200, response.content
    assert stored() == before


@pytest.mark.parametrize("value", ["maybe", "\uff11", "TRUE", "2"])
def test_drifted_that_is_not_a_flag_is_refused(environment, client_for, value):
    response = client_for("viewer").get(f"{ENV}/agents?drifted={value}")

    assert_refused_naming(response, "drifted")


@pytest.mark.parametrize("query", ["drifted=1&drifted=0", "decommissioned=true&decommissioned=any",
                                   "limit=5&limit=500", "offset=0&offset=1"])
def test_a_repeated_parameter_of_a_list_is_refused(environment, client_for, query):
    response = client_for("viewer").get(f"{ENV}/agents?{query}")

    assert_refused_naming(response, query.split("=")[0])


@pytest.mark.parametrize("value", ["%D9%A3", "%EF%BC%93", "%C2%B3", "+3", "3.0", "-3", "3%20",
                                   "0x3", "1e1"])
def test_a_number_that_is_not_ascii_digits_is_refused(environment, superuser, client_for,
                                                       value):
    publish(environment, superuser)
    viewer = client_for("viewer")

    for url, name in [(f"{ENV}/snapshots/1/diff?against={value}", "against"),
                      (f"{ENV}/snapshots?limit={value}", "limit"),
                      (f"{ENV}/agents?offset={value}", "offset")]:
        assert_refused_naming(viewer.get(url), name)


def test_an_ascii_number_is_read(environment, superuser, client_for):
    publish(environment, superuser)

    response = client_for("viewer").get(f"{ENV}/snapshots/1/diff?against=1")

    assert response.status_code == 200, response.content


@pytest.mark.parametrize("value", ["\u0663", "1.0", 1.0, True, "+3", "3 ", "", "\uff13",
                                   "9" * 40, [3], {"n": 3}])
def test_a_body_number_that_is_not_a_whole_number_in_digits_is_refused(
        environment, client_for, value):
    response = client_for("owner").patch(ENV, {"poll_interval_s": value}, format="json")

    assert_error(response, 400, "invalid")
    assert response.json()["error"]["details"][0]["field"] == "poll_interval_s"
    environment.refresh_from_db()
    assert environment.poll_interval_s == 30


def test_an_enrollment_token_number_in_arabic_digits_is_refused(environment, client_for):
    response = client_for("owner").post(f"{ENV}/enrollment-tokens", {"uses": "\u0663"},
                                        format="json")

    assert_error(response, 400, "invalid")
    assert response.json()["error"]["details"][0]["field"] == "uses"


@pytest.mark.parametrize("value", [60, "60"])
def test_a_body_number_as_an_integer_or_ascii_digits_is_read(environment, client_for, value):
    response = client_for("owner").patch(ENV, {"poll_interval_s": value}, format="json")

    assert response.status_code == 200, response.content
    environment.refresh_from_db()
    assert environment.poll_interval_s == 60


@pytest.mark.parametrize(("text", "number"), [("3", 3), ("007", 7), ("10", 10), ("11", None),
                                              ("\u0663", None), ("\uff13", None), ("", None),
                                              ("0" * 50 + "1", 1), ("1" * 50, None)])
def test_whole_number_is_ascii_digits_within_the_bound(text, number):
    assert whole_number(text, maximum=10) == number
