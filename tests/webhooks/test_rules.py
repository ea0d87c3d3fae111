"""The pure rules of webhooks: signatures, bodies, backoff, events and URLs/addresses."""

import hashlib
import hmac
import json

import pytest

from apps.core.events import DOMAIN_EVENTS
from apps.webhooks import rules


def test_the_signature_is_hmac_sha256_over_timestamp_and_body():
    expected = hmac.new(b"s3cret", b"1700000000.{}", hashlib.sha256).hexdigest()
    assert rules.signature("s3cret", 1700000000, b"{}") == f"sha256={expected}"
    assert rules.signature("other", 1700000000, b"{}") != f"sha256={expected}"


def test_the_body_is_stable_json_naming_event_and_sequence():
    text = rules.body(event="rollout.started", sequence=3, environment="shop/prod",
                      occurred_at="t", data={"rollout": 1})
    assert json.loads(text) == {"event": "rollout.started", "sequence": 3,
                                "environment": "shop/prod", "occurred_at": "t",
                                "data": {"rollout": 1}}
    assert text == rules.body(event="rollout.started", sequence=3, environment="shop/prod",
                              occurred_at="t", data={"rollout": 1})


def test_backoff_doubles_up_to_its_bound():
    assert [rules.backoff_s(n, base_s=10, most_s=60) for n in range(1, 6)] == [
        10, 20, 40, 60, 60]


def test_events_are_known_names_each_once():
    assert rules.events_problem(["rollout.started", "approval.given"]) is None
    assert set(DOMAIN_EVENTS) >= {"approval.requested", "approval.given", "drift.reported"}
    assert rules.events_problem([]) is not None
    assert "unknown event" in rules.events_problem(["rollout.exploded"])
    assert rules.events_problem(["drift.reported", "drift.reported"]) == "each event once"


@pytest.mark.parametrize("address", ["127.0.0.1", "10.1.2.3", "192.168.0.1", "172.16.0.1",
                                     "169.254.169.254", "::1", "fe80::1", "0.0.0.0",
                                     "::ffff:127.0.0.1", "224.0.0.1", "100.64.0.1"])
def test_private_loopback_and_metadata_addresses_are_refused(address):
    assert rules.address_refused(address)


def test_a_public_address_is_allowed():
    assert not rules.address_refused("93.184.216.34")


@pytest.mark.parametrize("url", ["ftp://example.com/", "http:///nohost", "https://u:p@x.com/",
                                 "http://127.0.0.1:9/hook", "http://localhost/hook",
                                 "http://[::1]/", "http://x.com:99999/", "x" * 3000])
def test_bad_or_private_urls_are_refused(url):
    assert rules.url_problem(url, allow_private=False) is not None


def test_a_setting_allows_loopback_urls_and_names_pass_until_delivery():
    assert rules.url_problem("http://127.0.0.1:9/hook", allow_private=True) is None
    assert rules.url_problem("https://hooks.example.com/x?y=1", allow_private=False) is None
