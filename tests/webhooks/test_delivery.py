"""Deliveries to a real receiver (a threaded HTTP server on 127.0.0.1): domain events
become numbered deliveries in their transaction; each request is signed with the
endpoint's secret; a 500 is retried (by the task, after its backoff) and nothing
later is sent before it succeeds; deliveries arrive in sequence order; redirects
are never followed; private addresses are refused unless allowed; responses are
read up to a bound; a slow receiver times out."""

import json
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from apps.core.events import announce
from apps.rollouts.reconcile import rollout_reconcile
from apps.webhooks import services, tasks
from apps.webhooks.models import WebhookDelivery
from tests.factories import ack, publish_variant, start_rollout
from tests.rollouts.support import confirm

pytestmark = pytest.mark.django_db

ROLLOUT_EVENTS = ["rollout.started", "rollout.wave_advanced", "rollout.confirmed",
                  "rollout.completed", "rollout.rolled_back"]


def _endpoint(environment, receiver, superuser, events=None):
    live, url = receiver
    endpoint, secret = services.endpoint_create(environment=environment, url=url,
                                                events=events or ROLLOUT_EVENTS,
                                                actor=superuser)
    live.secret = secret
    return endpoint


def _announce(environment, count: int) -> None:
    for n in range(count):
        announce("rollout.started", environment_id=environment.pk, rollout=n + 1)


def _states(endpoint) -> list[tuple[int, str, int]]:
    return list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("sequence")
                .values_list("sequence", "state", "attempts"))


def test_a_rollout_announces_its_events_as_numbered_signed_deliveries(
        environment, second, fleet, receiver, superuser, django_capture_on_commit_callbacks):
    live, _ = receiver
    endpoint = _endpoint(environment, receiver, superuser)
    nodes = fleet(2)
    with django_capture_on_commit_callbacks(execute=True):
        rollout = start_rollout(environment, second, nodes[:1])
    ack(nodes[0], second)
    with django_capture_on_commit_callbacks(execute=True):
        confirm(rollout)

    assert [(r.sequence, r.event) for r in live.received] == [
        (1, "rollout.started"), (2, "rollout.confirmed"), (3, "rollout.wave_advanced")]
    assert all(r.signature_ok for r in live.received)
    body = json.loads(live.received[0].body)
    assert (body["environment"], body["data"]["rollout"], body["data"]["snapshot"]) == (
        "shop/prod", rollout.pk, 2)
    assert _states(endpoint) == [(1, "succeeded", 1), (2, "succeeded", 1),
                                 (3, "succeeded", 1)]


def test_an_automatic_rollback_says_which_agents_failed_and_what_they_reported(
        environment, second, fleet, receiver, superuser, django_capture_on_commit_callbacks):
    live, _ = receiver
    _endpoint(environment, receiver, superuser)
    nodes = fleet(2)
    rollout = start_rollout(environment, second, nodes[:1])
    said = "#2 failed (validate exited 1: bad marker); nothing was changed, #1 stays"
    ack(nodes[0], second, status="failed", message=said)

    with django_capture_on_commit_callbacks(execute=True):
        assert rollout_reconcile(rollout_id=rollout.pk) == "rolled_back"

    [rolled_back] = [json.loads(r.body) for r in live.received
                     if r.event == "rollout.rolled_back"]
    assert rolled_back["data"]["reason"] == f"more than 0 target(s) failed; web-1: {said}"
    assert rolled_back["data"]["failures"] == [
        {"agent": "web-1", "status": "failed", "message": said}]


def test_a_500_is_retried_and_nothing_later_overtakes_it(environment, receiver, superuser):
    live, _ = receiver
    endpoint = _endpoint(environment, receiver, superuser)
    live.script = {1: [500, 500]}
    _announce(environment, 3)

    tasks.webhook_deliver_task.delay(endpoint.pk)

    assert [(r.sequence, r.answered) for r in live.received] == [
        (1, 500), (1, 500), (1, 200), (2, 200), (3, 200)]
    assert all(r.signature_ok for r in live.received)
    assert len({r.delivery for r in live.received[:3]}) == 1  # one delivery, three tries
    assert _states(endpoint) == [(1, "succeeded", 3), (2, "succeeded", 1),
                                 (3, "succeeded", 1)]
    log = WebhookDelivery.objects.get(endpoint=endpoint, sequence=1).log
    assert [entry["status"] for entry in log] == [500, 500, 200]


def test_a_retry_waits_for_its_backoff_and_holds_the_later_ones(
        environment, receiver, superuser, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "backoff_s": 60}
    live, _ = receiver
    endpoint = _endpoint(environment, receiver, superuser)
    live.script = {1: [503]}
    _announce(environment, 2)

    tasks.webhook_deliver_task.delay(endpoint.pk)
    assert [r.sequence for r in live.received] == [1]
    first = WebhookDelivery.objects.get(endpoint=endpoint, sequence=1)
    assert first.next_attempt_at > timezone.now() + timedelta(seconds=50)
    assert tasks.webhooks_sweep_task() == 0  # not due yet: the sweep leaves it

    first.next_attempt_at = timezone.now() - timedelta(seconds=1)
    first.save(update_fields=["next_attempt_at"])
    assert tasks.webhooks_sweep_task() == 1
    assert [r.sequence for r in live.received] == [1, 1, 2]


def test_a_delivery_given_up_on_leaves_a_gap_and_the_next_goes_on(
        environment, receiver, superuser):
    live, _ = receiver
    endpoint = _endpoint(environment, receiver, superuser)
    live.script = {1: [500] * 10}
    _announce(environment, 2)

    tasks.webhook_deliver_task.delay(endpoint.pk)

    assert [r.sequence for r in live.received] == [1, 1, 1, 1, 2]  # max_attempts 4
    assert _states(endpoint) == [(1, "failed", 4), (2, "succeeded", 1)]


def test_a_redirect_is_not_followed(environment, receiver, superuser):
    live, _ = receiver
    live.redirect = True
    endpoint = _endpoint(environment, receiver, superuser)
    _announce(environment, 1)

    tasks.webhook_deliver_task.delay(endpoint.pk)

    assert [r.path for r in live.received] == ["/hook"] * 4  # never /elsewhere
    assert _states(endpoint) == [(1, "failed", 4)]
    assert WebhookDelivery.objects.get(endpoint=endpoint).last_status == 302


def test_loopback_is_refused_at_delivery_without_the_setting(
        environment, receiver, superuser, settings):
    live, _ = receiver
    endpoint = _endpoint(environment, receiver, superuser)
    _announce(environment, 1)
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "allow_private": False}

    tasks.webhook_deliver_task.delay(endpoint.pk)

    assert live.received == []
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert (delivery.state, delivery.attempts) == ("failed", 1)
    assert "private or loopback" in delivery.last_error


def test_a_large_response_is_read_only_up_to_its_bound(environment, receiver, superuser):
    live, _ = receiver
    live.large_body = True
    endpoint = _endpoint(environment, receiver, superuser)
    _announce(environment, 1)

    tasks.webhook_deliver_task.delay(endpoint.pk)

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.state == "succeeded"
    assert len(delivery.log[0]["response"]) <= 500


@pytest.mark.slow
def test_a_slow_receiver_times_out_and_is_retried(environment, receiver, superuser, settings):
    settings.BELLWETHER_WEBHOOKS = {**settings.BELLWETHER_WEBHOOKS, "max_attempts": 1}
    live, _ = receiver
    live.delay_s = 2.5
    endpoint = _endpoint(environment, receiver, superuser)
    _announce(environment, 1)

    tasks.webhook_deliver_task.delay(endpoint.pk)

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.state == "failed"
    assert "timed out" in delivery.last_error.lower() or "timeout" in delivery.last_error


def test_only_subscribed_enabled_endpoints_get_a_delivery(environment, receiver, superuser):
    endpoint = _endpoint(environment, receiver, superuser, events=["drift.reported"])
    _announce(environment, 1)
    assert not WebhookDelivery.objects.exists()
    services.endpoint_update(endpoint=endpoint, actor=superuser, enabled=False)
    announce("drift.reported", environment_id=environment.pk, agent=1)
    assert not WebhookDelivery.objects.exists()


def test_an_event_rolled_back_with_its_change_leaves_no_delivery(
        environment, receiver, superuser):
    _endpoint(environment, receiver, superuser)
    with pytest.raises(RuntimeError), transaction.atomic():
        _announce(environment, 1)
        raise RuntimeError("the change fails")
    assert not WebhookDelivery.objects.exists()


def test_publishing_announces_snapshot_published(environment, receiver, superuser, first):
    endpoint = _endpoint(environment, receiver, superuser, events=["snapshot.published"])
    publish_variant(environment, superuser, workers=2)
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert json.loads(delivery.body)["data"]["snapshot"] == 2


def test_event_data_may_use_any_key_even_name(environment, receiver, superuser):
    endpoint = _endpoint(environment, receiver, superuser, events=["drift.reported"])
    announce("drift.reported", environment_id=environment.pk, agent=1, name="web-1")
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert json.loads(delivery.body)["data"] == {"agent": 1, "name": "web-1"}
