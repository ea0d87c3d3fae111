"""POST /api/v1/agent/enroll: an enrollment token is exchanged for the agent's own token."""

import hashlib
import json
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone
from rest_framework.test import APIClient

from apps.core.parsers import ANONYMOUS_BODY_BYTES
from apps.fleet import enrollment
from apps.fleet.models import Agent, EnrollmentToken
from tests.api_helpers import assert_error
from tests.factories import DESIRED, api_token, bearer_client
from tests.fleet.support import ENROLL, REPORTS, bundle_url, enroll_over_http


def _row_text(model, pk) -> str:
    return repr(list(model.objects.filter(pk=pk).values()))


def test_enrollment_returns_the_agents_id_token_and_environment(enrollment_token):
    _, secret = enrollment_token()

    response = enroll_over_http(secret, labels={"zone": "eu-1", "role": "edge"})

    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"agent_id", "token", "environment"}
    assert body["environment"] == "shop/prod"
    assert body["token"].startswith("bwa_")
    agent = Agent.objects.get(pk=body["agent_id"])
    assert (agent.name, agent.labels, agent.mode, agent.enabled) == (
        "web-1", {"zone": "eu-1", "role": "edge"}, "auto_pull", True)
    assert agent.environment.full_name == "shop/prod"


def test_enrolled_token_authenticates_the_agent(enrollment_token):
    _, secret = enrollment_token()
    token = enroll_over_http(secret).json()["token"]

    response = bearer_client(token).get(DESIRED)

    assert response.status_code == 200
    assert response.json()["mode"] == "auto_pull"


def test_labels_default_to_empty(enrollment_token):
    _, secret = enrollment_token()

    response = enroll_over_http(secret)

    assert response.status_code == 201
    assert Agent.objects.get(pk=response.json()["agent_id"]).labels == {}


def test_only_hashes_of_both_secrets_are_stored(enrollment_token):
    token_row, enrollment_secret = enrollment_token()

    body = enroll_over_http(enrollment_secret).json()

    enrollment_part = enrollment_secret.partition(".")[2]
    agent_part = body["token"].partition(".")[2]
    stored = _row_text(EnrollmentToken, token_row.pk) + _row_text(Agent, body["agent_id"])
    assert enrollment_part not in stored
    assert agent_part not in stored
    agent = Agent.objects.get(pk=body["agent_id"])
    assert agent.token_hash == hashlib.sha256(agent_part.encode()).hexdigest()
    assert token_row.secret_hash == hashlib.sha256(enrollment_part.encode()).hexdigest()


def test_each_enrollment_uses_up_one_use(enrollment_token):
    token_row, secret = enrollment_token(uses=3)

    statuses = [enroll_over_http(secret, name=f"web-{i}").status_code for i in range(4)]

    assert statuses == [201, 201, 201, 401]
    token_row.refresh_from_db()
    assert token_row.uses == 3
    assert Agent.objects.count() == 3


def _unknown(token_row, secret):
    return "bwe_0123456789ab.no-such-secret"


def _wrong_secret(token_row, secret):
    return f"bwe_{token_row.key}.not-the-secret"


def _malformed(token_row, secret):
    return "not-a-token"


def _agent_prefix(token_row, secret):
    return secret.replace("bwe_", "bwa_", 1)


def _expired(token_row, secret):
    EnrollmentToken.objects.filter(pk=token_row.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1))
    return secret


def _revoked(token_row, secret):
    enrollment.enrollment_token_revoke(token=token_row, actor=None)
    return secret


def _used_up(token_row, secret):
    assert enroll_over_http(secret, name="first").status_code == 201
    return secret


REFUSED = {
    "unknown": _unknown,
    "wrong-secret": _wrong_secret,
    "malformed": _malformed,
    "agent-prefix": _agent_prefix,
    "expired": _expired,
    "revoked": _revoked,
    "used-up": _used_up,
}


@pytest.mark.parametrize("case", REFUSED)
def test_unusable_enrollment_token_is_refused_with_401(case, enrollment_token):
    token_row, secret = enrollment_token(uses=1)
    presented = REFUSED[case](token_row, secret)
    agents_before = Agent.objects.count()

    response = enroll_over_http(presented, name="web-9")

    assert_error(response, 401, "authentication_failed")
    assert Agent.objects.count() == agents_before


def test_a_token_of_another_kind_is_refused_saying_what_it_is(enrollment_token, superuser):
    token_row, secret = enrollment_token(uses=1)
    _, api_secret = api_token(superuser)

    as_api_token = enroll_over_http(api_secret, name="web-9")
    as_agent_token = enroll_over_http(secret.replace("bwe_", "bwa_", 1), name="web-9")

    message = assert_error(as_api_token, 401, "authentication_failed")["message"]
    assert "This is an API token (bwu_…), not an enrollment token" in message
    assert "manage.py enrollment_token create <app>/<env>" in message
    message = assert_error(as_agent_token, 401, "authentication_failed")["message"]
    assert "This is an agent token (bwa_…), not an enrollment token" in message
    assert not Agent.objects.exists()


@pytest.mark.parametrize("kind", ["enrollment", "api"])
def test_a_poll_with_a_token_of_another_kind_is_refused_saying_what_it_is(
        kind, enrollment_token, superuser):
    secret = enrollment_token(uses=1)[1] if kind == "enrollment" else api_token(superuser)[1]

    response = bearer_client(secret).get(DESIRED)

    message = assert_error(response, 401)["message"]
    assert message.startswith("This is an enrollment token (bwe_…), not an agent token"
                              if kind == "enrollment" else
                              "This is an API token (bwu_…), not an agent token"), message


def test_taken_name_is_a_409_and_costs_no_use(enrollment_token):
    _, first_secret = enrollment_token()
    token_row, secret = enrollment_token(uses=2)
    assert enroll_over_http(first_secret, name="web-1").status_code == 201

    response = enroll_over_http(secret, name="web-1")

    assert_error(response, 409, "name_taken")
    token_row.refresh_from_db()
    assert token_row.uses == 0
    assert Agent.objects.filter(name="web-1").count() == 1


def test_the_same_name_in_another_environment_is_free(enrollment_token, blog):
    _, shop_secret = enrollment_token()
    _, blog_secret = enrollment_token(env=blog)

    shop = enroll_over_http(shop_secret, name="web-1")
    other = enroll_over_http(blog_secret, name="web-1")

    assert (shop.status_code, other.status_code) == (201, 201)
    assert other.json()["environment"] == "blog/prod"


@pytest.mark.parametrize("name", ["", "Web-1", "web 1", "-web", "web-", "w" * 65, "web_1"])
def test_bad_name_is_a_400(name, enrollment_token):
    token_row, secret = enrollment_token()

    response = enroll_over_http(secret, name=name)

    assert_error(response, 400)
    token_row.refresh_from_db()
    assert token_row.uses == 0
    assert not Agent.objects.exists()


@pytest.mark.parametrize("labels", [
    ["zone", "eu"],
    "zone=eu",
    {"zone": None},
    {"zone": {"nested": "x"}},
    {"": "empty-key"},
    {"k" * 64: "key-too-long"},
    {"zone": "v" * 256},
    {f"k{i}": "v" for i in range(33)},
], ids=["list", "string", "null-value", "nested", "empty-key", "long-key", "long-value",
        "too-many"])
def test_bad_labels_are_a_400(labels, enrollment_token):
    token_row, secret = enrollment_token()

    response = enroll_over_http(secret, labels=labels)

    assert_error(response, 400)
    token_row.refresh_from_db()
    assert token_row.uses == 0
    assert not Agent.objects.exists()


@pytest.mark.parametrize("missing", ["enrollment_token", "name"])
def test_missing_field_is_a_400(missing, enrollment_token):
    _, secret = enrollment_token()
    body = {"enrollment_token": secret, "name": "web-1"}
    del body[missing]

    response = APIClient().post(ENROLL, body, format="json")

    assert_error(response, 400)
    assert not Agent.objects.exists()


@pytest.mark.parametrize("method,url", [
    ("get", DESIRED),
    ("head", DESIRED),
    ("get", bundle_url(1)),
    ("post", REPORTS),
])
def test_enrollment_token_cannot_call_other_agent_endpoints(method, url, enrollment_token,
                                                            first):
    _, secret = enrollment_token(uses=5)
    client = bearer_client(secret)
    body = {"snapshot": 1, "checksum": first.checksum, "status": "succeeded"}

    response = client.post(url, body, format="json") if method == "post" else getattr(
        client, method)(url)

    assert response.status_code == 401
    if method != "head":
        assert_error(response, 401)
    assert not Agent.objects.exists()


def test_the_largest_enrollment_fits_and_a_larger_body_is_413_before_it_is_parsed(
        enrollment_token):
    """Anyone may enroll: its body is bounded at ANONYMOUS_BODY_BYTES, which the
    largest valid enrollment (32 labels of the longest keys and values, every
    character escaped in the JSON) fits."""
    _, secret = enrollment_token()
    labels = {f"{n:02d}" + "é" * 61: "é" * 255 for n in range(32)}
    largest = json.dumps({"enrollment_token": secret, "name": "n" * 64, "labels": labels})
    assert len(largest) < ANONYMOUS_BODY_BYTES < settings.DATA_UPLOAD_MAX_MEMORY_SIZE

    fits = APIClient().post(ENROLL, largest, content_type="application/json")
    too_large = APIClient().post(ENROLL, largest + " " * ANONYMOUS_BODY_BYTES,
                                 content_type="application/json")

    assert fits.status_code == 201, fits.content
    assert_error(too_large, 413, "too_large")
    assert str(ANONYMOUS_BODY_BYTES) in too_large.json()["error"]["message"]
    assert Agent.objects.count() == 1
