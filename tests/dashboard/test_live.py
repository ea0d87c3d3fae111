"""The live websocket at /ws/live/ through project.asgi.application (the real router,
origin validator and auth stack): who may connect, what the hello lists, which
events reach whom, that events carry ids only, and that signing out, deactivation
or a deleted session end the delivery.

The consumer reads the database from another thread, so every test runs with
transaction=True; database work in a test goes through database_sync_to_async.
"""

import json
from importlib import import_module

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.test import Client

from apps.environments.models import Environment
from apps.fleet import services as fleet
from apps.releases import services as releases
from apps.releases.services import environment_update, snapshot_publish
from apps.tenancy.models import Membership
from apps.tenancy.services import membership_remove, membership_set
from tests import factories

pytestmark = pytest.mark.django_db(transaction=True)

SIGNED_OUT = 4401  # this session signed out: the page stops
SESSION_CHANGED = 4403  # the check failed: the page reconnects, the handshake decides
SECRET = "s3cr3t-marker"  # put into configs, labels and messages; never in an event
# How long "nothing (more) arrives" is watched for. An event is on its way once the
# change that sends it has committed, and the first one is waited for up to
# ARRIVAL_S: this window only has to cover the gap between events of one change.
QUIET_S = 0.25
ARRIVAL_S = 2

# Every shape an event may have: its kind, its environment and ids, nothing else.
SHAPES = {
    "agent": [{"kind", "environment", "id"}, {"kind", "environment"}],
    "deployment": [{"kind", "environment", "id", "agent", "snapshot"}],
    "snapshot": [{"kind", "environment", "number"}],
    "rollout": [{"kind", "environment", "id"}],
    "pending": [{"kind", "environment"}],
}


@pytest.fixture
def app():
    """project.asgi.application, imported once pytest-django's test environment has
    added "testserver" to ALLOWED_HOSTS: AllowedHostsOriginValidator copies them when
    the application is built."""
    from project.asgi import application

    return application


@database_sync_to_async
def sign_in(user) -> tuple[Client, str]:
    """A browser signed in as `user`: its client and its session key."""
    client = factories.session_client(user)
    return client, client.cookies[settings.SESSION_COOKIE_NAME].value


async def session_of(user) -> str:
    return (await sign_in(user))[1]


@pytest.fixture
async def socket(app):
    """socket(session_key, query=..., origin=...) -> a WebsocketCommunicator to
    /ws/live/, not yet connected; every one is disconnected after the test."""
    made = []

    def make(session_key: str | None, *, query: str = "",
             origin: bytes | None = b"http://testserver") -> WebsocketCommunicator:
        headers = [(b"host", b"testserver")]
        if origin is not None:
            headers.append((b"origin", origin))
        if session_key is not None:
            headers.append((b"cookie", f"{settings.SESSION_COOKIE_NAME}={session_key}".encode()))
        communicator = WebsocketCommunicator(
            app, "/ws/live/" + (f"?{query}" if query else ""), headers=headers)
        made.append(communicator)
        return communicator

    yield make
    # A consumer on the Redis layer ends only once its pending pop returns; after the
    # test it is cancelled instead of waited for (up to a second per socket).
    for communicator in made:
        await communicator.disconnect(timeout=0.1)


@pytest.fixture
def live(socket):
    """await live(session_key, query=...) -> (connected socket, its hello)."""

    async def connect(session_key: str, *, query: str = ""):
        communicator = socket(session_key, query=query)
        connected, _ = await communicator.connect()
        assert connected
        hello = await communicator.receive_json_from()
        assert hello["kind"] == "hello"
        return communicator, hello

    return connect


async def drain(communicator) -> list[dict]:
    """Every event that arrives: the first within ARRIVAL_S, then each until the
    socket stays quiet for QUIET_S."""
    received = [await communicator.receive_json_from(timeout=ARRIVAL_S)]
    while not await communicator.receive_nothing(timeout=QUIET_S):
        received.append(await communicator.receive_json_from())
    return received


def assert_ids_only(events: list[dict]) -> None:
    for event in events:
        assert set(event) in SHAPES[event["kind"]], event
        assert all(isinstance(value, int | str) for value in event.values()), event
        assert SECRET not in json.dumps(event), event


def run(function, /, **kwargs):
    """Call a service from the test (the test's loop must not touch the database)."""
    return database_sync_to_async(function)(**kwargs)


def _bump_workers(environment: Environment, workers: int) -> str:
    return environment.config.replace("workers: 4", f"workers: {workers}")


@pytest.fixture
def viewer(member):
    """A viewer of the shop-team tenant: sees shop/prod (and shop/staging)."""
    return member("viewer")


@pytest.fixture
def staging(application, superuser) -> Environment:
    """shop/staging, with shop/prod's config and no templates."""
    return factories.environment(application, "staging", actor=superuser)


@pytest.fixture
def enrolled(environment, superuser):
    return factories.enrolled_agent(environment, "web-1", actor=superuser).agent


# -- who may connect ----------------------------------------------------------------------


async def test_anonymous_connection_is_refused(socket, environment):
    connected, _ = await socket(None).connect()

    assert not connected


async def test_connection_with_an_unknown_session_is_refused(socket, environment):
    connected, _ = await socket("no-such-session-key").connect()

    assert not connected


async def test_connection_from_a_foreign_origin_is_refused_even_with_a_valid_session(
    socket, viewer
):
    _, key = await sign_in(viewer)

    connected, _ = await socket(key, origin=b"https://evil.example").connect()

    assert not connected


async def test_connection_without_an_origin_is_refused(socket, viewer):
    _, key = await sign_in(viewer)

    connected, _ = await socket(key, origin=None).connect()

    assert not connected


async def test_connection_of_a_deactivated_user_is_refused(socket, viewer):
    _, key = await sign_in(viewer)
    viewer.is_active = False
    await database_sync_to_async(viewer.save)(update_fields=["is_active"])

    connected, _ = await socket(key).connect()

    assert not connected


async def test_connection_with_a_valid_session_and_origin_is_accepted(socket, viewer):
    _, key = await sign_in(viewer)

    connected, _ = await socket(key).connect()

    assert connected


# -- hello and narrowing ------------------------------------------------------------------


async def test_hello_lists_the_environments_the_user_may_see(
    live, viewer, environment, staging, blog, superuser
):
    _, key = await sign_in(viewer)

    _, hello = await live(key)

    assert hello == {"kind": "hello", "environments": [environment.pk, staging.pk]}


async def test_hello_of_a_superuser_lists_every_environment(
    live, superuser, environment, staging, blog
):
    _, key = await sign_in(superuser)

    _, hello = await live(key)

    assert hello["environments"] == sorted([environment.pk, staging.pk, blog.pk])


async def test_environment_query_narrows_the_subscription_and_ignores_invisible_ids(
    live, viewer, environment, staging, blog, superuser
):
    _, key = await sign_in(viewer)

    ws, hello = await live(key, query=f"environment={staging.pk}&environment={blog.pk}")
    assert hello["environments"] == [staging.pk]

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)
    assert await ws.receive_nothing(timeout=QUIET_S)
    await run(environment_update, environment=staging,
              config=_bump_workers(staging, 5), actor=superuser)
    assert await ws.receive_json_from(timeout=ARRIVAL_S) == {"kind": "pending",
                                                     "environment": staging.pk}


async def test_environment_query_of_only_invisible_ids_subscribes_to_none(
    live, viewer, environment, blog, superuser
):
    _, key = await sign_in(viewer)

    ws, hello = await live(key, query=f"environment={blog.pk}")

    assert hello["environments"] == []
    await run(environment_update, environment=blog, config="a: 2\n", actor=superuser)
    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)
    assert await ws.receive_nothing(timeout=QUIET_S)


# -- who receives what --------------------------------------------------------------------


async def test_event_reaches_only_users_who_may_see_its_environment(
    live, viewer, outsider, environment, blog, superuser
):
    viewer_ws, _ = await live(await session_of(viewer))
    outsider_ws, _ = await live(await session_of(outsider))

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert await viewer_ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "pending", "environment": environment.pk}
    assert await outsider_ws.receive_nothing(timeout=QUIET_S)

    await run(environment_update, environment=blog, config="a: 2\n", actor=superuser)

    assert await outsider_ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "pending", "environment": blog.pk}
    assert await viewer_ws.receive_nothing(timeout=QUIET_S)


async def test_agent_change_reaches_only_users_who_may_see_its_environment(
    live, viewer, outsider, environment, enrolled, superuser
):
    viewer_ws, _ = await live(await session_of(viewer))
    outsider_ws, _ = await live(await session_of(outsider))

    await run(fleet.agent_update, agent=enrolled, enabled=False, actor=superuser)

    assert await viewer_ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "agent", "environment": environment.pk, "id": enrolled.pk}
    assert await outsider_ws.receive_nothing(timeout=QUIET_S)


# -- events carry ids only ----------------------------------------------------------------


async def test_pending_event_names_only_the_environment(live, viewer, environment, superuser):
    ws, _ = await live(await session_of(viewer))

    await run(environment_update, environment=environment,
              config=environment.config + f"note: {SECRET}\n", actor=superuser)

    events = await drain(ws)
    assert events == [{"kind": "pending", "environment": environment.pk}]
    assert_ids_only(events)


async def test_agent_event_carries_the_agent_id_and_not_its_labels(
    live, viewer, environment, enrolled, superuser
):
    ws, _ = await live(await session_of(viewer))

    await run(fleet.agent_update, agent=enrolled, labels={"note": SECRET}, actor=superuser)

    events = await drain(ws)
    assert events == [{"kind": "agent", "environment": environment.pk, "id": enrolled.pk}]
    assert_ids_only(events)


async def test_deployment_event_carries_ids_and_not_the_report_message(
    live, viewer, environment, enrolled, first
):
    ws, _ = await live(await session_of(viewer))

    deployment, created = await run(
        releases.report_intake, agent=enrolled, deployment_id=None, number=first.number,
        checksum=first.checksum, status="failed", message=f"disk full: {SECRET}")

    assert created
    events = await drain(ws)
    assert events == [
        {"kind": "deployment", "environment": environment.pk, "id": str(deployment.pk),
         "agent": enrolled.pk, "snapshot": first.number},
        {"kind": "agent", "environment": environment.pk, "id": enrolled.pk},
    ]
    assert_ids_only(events)


@pytest.fixture
def secret_config(environment, superuser) -> Environment:
    """shop/prod with SECRET in its config."""
    return environment_update(environment=environment,
                              config=environment.config + f"note: {SECRET}\n", actor=superuser)


async def test_snapshot_event_carries_the_number_and_not_the_content(
    live, viewer, secret_config, superuser
):
    environment = secret_config
    ws, _ = await live(await session_of(viewer))

    await run(snapshot_publish, environment=environment, actor=superuser)

    events = await drain(ws)
    snapshot_events = [e for e in events if e["kind"] == "snapshot"]
    assert snapshot_events and all(
        e == {"kind": "snapshot", "environment": environment.pk, "number": 1}
        for e in snapshot_events), events
    assert {e["kind"] for e in events} <= set(SHAPES)
    assert {"kind": "pending", "environment": environment.pk} in events
    assert_ids_only(events)


@pytest.fixture
def staged(application, superuser):
    """shop/canary with #1 active, #2 ready, and two enrolled agents."""
    env, _, second = factories.staged_environment(application, "canary", superuser)
    return env, second, factories.enrolled_agents(env, 2)


async def test_rollout_event_carries_the_rollout_id(live, viewer, staged, superuser):
    env, second, nodes = staged
    ws, _ = await live(await session_of(viewer))

    rollout = await database_sync_to_async(factories.start_rollout)(env, second, [nodes[0]],
                                                                   actor=superuser)

    events = await drain(ws)
    assert {"kind": "rollout", "environment": env.pk, "id": rollout.pk} in events
    assert all(e == {"kind": "rollout", "environment": env.pk, "id": rollout.pk}
               for e in events if e["kind"] == "rollout"), events
    assert_ids_only(events)


# -- signing out, deactivation, deleted sessions ------------------------------------------


async def test_logout_closes_that_sessions_socket_and_stops_its_events(
    live, viewer, environment, superuser
):
    client, key = await sign_in(viewer)
    ws, _ = await live(key)

    await database_sync_to_async(client.logout)()

    assert await ws.receive_output(timeout=ARRIVAL_S) == {"type": "websocket.close",
                                                  "code": SIGNED_OUT}
    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)
    assert await ws.receive_nothing(timeout=QUIET_S)


async def test_logout_leaves_another_session_of_the_same_user_open(
    live, viewer, environment, superuser
):
    client, key = await sign_in(viewer)
    _, other_key = await sign_in(viewer)
    assert other_key != key
    ws, _ = await live(key)
    other_ws, _ = await live(other_key)

    await database_sync_to_async(client.logout)()

    assert (await ws.receive_output(timeout=ARRIVAL_S))["code"] == SIGNED_OUT
    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)
    assert await other_ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "pending", "environment": environment.pk}
    assert await ws.receive_nothing(timeout=QUIET_S)


async def test_recheck_of_a_valid_session_forwards_the_event(
    live, viewer, environment, superuser, settings
):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, _ = await live(await session_of(viewer))

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert await ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "pending", "environment": environment.pk}


async def test_deactivated_user_is_disconnected_instead_of_receiving_the_event(
    live, viewer, environment, superuser, settings
):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, _ = await live(await session_of(viewer))
    viewer.is_active = False
    await database_sync_to_async(viewer.save)(update_fields=["is_active"])

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert await ws.receive_output(timeout=ARRIVAL_S) == {"type": "websocket.close",
                                                  "code": SESSION_CHANGED}
    assert await ws.receive_nothing(timeout=QUIET_S)


async def test_deleted_session_is_disconnected_instead_of_receiving_the_event(
    live, viewer, environment, superuser, settings
):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    _, key = await sign_in(viewer)
    ws, _ = await live(key)
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    await database_sync_to_async(store.delete)(key)

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert await ws.receive_output(timeout=ARRIVAL_S) == {"type": "websocket.close",
                                                  "code": SESSION_CHANGED}
    assert await ws.receive_nothing(timeout=QUIET_S)


async def test_password_change_elsewhere_disconnects_the_socket(
    live, viewer, environment, superuser, settings
):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, _ = await live(await session_of(viewer))
    viewer.set_password("a-new-password")
    await database_sync_to_async(viewer.save)()

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert (await ws.receive_output(timeout=ARRIVAL_S))["code"] == SESSION_CHANGED


async def test_without_a_recheck_due_events_are_forwarded_without_a_session_lookup(
    live, viewer, environment, superuser, settings
):
    """The re-check is rate limited: within BELLWETHER_LIVE_RECHECK_S of the last one
    an event is forwarded as it is (a deleted session is noticed later)."""
    settings.BELLWETHER_LIVE_RECHECK_S = 3600
    _, key = await sign_in(viewer)
    ws, _ = await live(key)
    store = import_module(settings.SESSION_ENGINE).SessionStore()
    await database_sync_to_async(store.delete)(key)

    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert await ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "pending", "environment": environment.pk}


@pytest.fixture
def membership(viewer):
    return Membership.objects.select_related("tenant", "user").get(user=viewer)


async def test_removed_member_stops_receiving_the_tenants_events(
    live, viewer, membership, environment, superuser, settings
):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, hello = await live(await session_of(viewer))
    assert hello["environments"] == [environment.pk]

    await run(membership_remove, membership=membership, actor=superuser)
    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    outputs = []
    while not await ws.receive_nothing(timeout=QUIET_S):
        outputs.append(await ws.receive_output())
    assert not any(output["type"] == "websocket.send" for output in outputs), outputs


# -- ping ---------------------------------------------------------------------------------


async def test_ping_is_answered_with_pong(live, viewer):
    ws, _ = await live(await session_of(viewer))

    await ws.send_json_to({"kind": "ping"})

    assert await ws.receive_json_from() == {"kind": "pong"}


async def test_anything_but_a_ping_is_ignored(live, viewer):
    ws, _ = await live(await session_of(viewer))

    await ws.send_json_to({"kind": "subscribe", "environment": 1})
    await ws.send_json_to(["ping"])

    assert await ws.receive_nothing(timeout=QUIET_S)


async def test_a_frame_that_is_not_json_is_ignored_and_the_socket_stays(live, viewer):
    ws, _ = await live(await session_of(viewer))

    await ws.send_to(text_data="not json {")
    await ws.send_to(text_data="[" * 200_000)  # nested past the parser's recursion limit
    await ws.send_to(bytes_data=b"\x00\x01")
    await ws.send_json_to({"kind": "ping"})

    assert await ws.receive_json_from() == {"kind": "pong"}


async def test_a_ping_checks_the_session_when_no_event_comes(live, viewer, settings):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, _ = await live(await session_of(viewer))
    viewer.is_active = False
    await database_sync_to_async(viewer.save)(update_fields=["is_active"])

    await ws.send_json_to({"kind": "ping"})

    assert await ws.receive_output(timeout=ARRIVAL_S) == {"type": "websocket.close",
                                                  "code": SESSION_CHANGED}


async def test_a_user_given_access_after_connecting_starts_receiving_its_events(
    live, outsider, environment, tenant, superuser, settings
):
    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, hello = await live(await session_of(outsider))
    assert environment.pk not in hello["environments"]
    await run(membership_set, tenant=tenant, user=outsider, role="viewer", actor=superuser)

    await ws.send_json_to({"kind": "ping"})  # the page pings every 25 s
    assert await ws.receive_json_from() == {"kind": "pong"}
    await run(environment_update, environment=environment,
              config=_bump_workers(environment, 5), actor=superuser)

    assert await ws.receive_json_from(timeout=ARRIVAL_S) == {
        "kind": "pending", "environment": environment.pk}


async def test_groups_are_joined_again_before_the_channel_layer_expires_them(
    live, viewer, environment, settings, monkeypatch
):
    """Channel layers drop a group member group_expiry (a day) after it joined."""
    from channels.layers import get_channel_layer

    from apps.dashboard import consumers

    settings.BELLWETHER_LIVE_RECHECK_S = 0
    ws, _ = await live(await session_of(viewer))
    layer, joined = get_channel_layer(), []
    group_add = layer.group_add

    async def spy(group, channel):
        joined.append(group)
        await group_add(group, channel)

    monkeypatch.setattr(layer, "group_add", spy)

    await ws.send_json_to({"kind": "ping"})
    assert await ws.receive_json_from() == {"kind": "pong"}
    assert joined == []  # checked, nothing new, not due for a refresh

    monkeypatch.setattr(consumers, "GROUP_REFRESH_S", 0)
    await ws.send_json_to({"kind": "ping"})
    assert await ws.receive_json_from() == {"kind": "pong"}
    assert f"environment.{environment.pk}" in joined and f"user.{viewer.pk}" in joined


def test_environment_ids_in_the_query_are_ascii_digits_only():
    from apps.dashboard.consumers import _wanted

    assert _wanted(b"environment=\xb2&environment=3&environment=x&other=4") == [3]


@pytest.mark.parametrize("origin", [
    b"http://testserver:9999", b"https://testserver", b"http://testserver:443",
    b"ws://testserver", b"null", b"http://testserver/path", b"http://user@testserver",
    b"http://testserver.evil.example", b"http://TESTSERVER:8o", b"http://testserver/",
])
async def test_connection_from_another_port_or_scheme_of_this_host_is_refused(
        socket, viewer, origin):
    _, key = await sign_in(viewer)

    connected, _ = await socket(key, origin=origin).connect()

    assert not connected


@pytest.mark.parametrize("origin", [b"http://testserver", b"http://TestServer:80"])
async def test_connection_from_this_very_origin_is_accepted(socket, viewer, origin):
    _, key = await sign_in(viewer)

    connected, _ = await socket(key, origin=origin).connect()

    assert connected


@pytest.mark.parametrize(("headers", "secure", "proxies", "expected"), [
    ({"host": "bw.example", "origin": "https://bw.example"}, True, 0, True),
    ({"host": "bw.example", "origin": "http://bw.example"}, True, 0, False),
    ({"host": "bw.example", "origin": "https://bw.example",
      "x-forwarded-proto": "https"}, False, 1, True),
    ({"host": "bw.example", "origin": "https://bw.example",
      "x-forwarded-proto": "https"}, False, 0, False),  # no proxy trusted to say so
    ({"host": "bw.example:8443", "origin": "https://bw.example:8443"}, True, 0, True),
    ({"host": "bw.example:8443", "origin": "https://bw.example"}, True, 0, False),
    ({"origin": "http://bw.example"}, False, 0, False),
])
def test_same_origin_compares_scheme_host_and_port(headers, secure, proxies, expected):
    from project.origins import same_origin

    assert same_origin(headers, secure=secure, proxy_count=proxies) is expected


async def test_an_open_socket_is_counted_for_metrics_until_it_closes(live, viewer):
    from prometheus_client import REGISTRY

    def open_sockets() -> float:
        return REGISTRY.get_sample_value("bellwether_websocket_connections") or 0.0

    before = open_sockets()
    communicator, _ = await live(await session_of(viewer))
    assert open_sockets() == before + 1
    await communicator.disconnect()
    assert open_sockets() == before
