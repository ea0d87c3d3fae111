"""The broker's transport (project/broker.py) against a Redis that dies: kombu
connections shaped as a Celery worker's (a channel consuming tasks, holding one
unacknowledged and waiting in BRPOP for the next; a channel on a broadcast queue,
as the worker's control channel is), closed as the worker closes them when it
loses the broker: `collect()`, then `close()`."""

import os
import signal
import socket

import pytest
from kombu import Connection, Consumer, Exchange, Queue

STOCK = "kombu.transport.redis:Transport"
OURS = "project.broker:Transport"


def connection_shaped_as_a_workers(url: str, transport: str) -> Connection:
    """Connected, one task delivered and not acknowledged, BRPOP in flight."""
    connection = Connection(url, transport=transport)
    tasks = Queue("tasks")
    with connection.Producer() as producer:
        producer.publish({"task": 1}, routing_key="tasks", declare=[tasks])
    held = []
    Consumer(connection.default_channel, [tasks], callbacks=[lambda _, m: held.append(m)],
             accept=["json"]).consume()
    Consumer(connection.channel(), [Queue("control", Exchange("control", type="fanout"),
                                          auto_delete=True)],
             callbacks=[lambda *_: None], accept=["json"], no_ack=True).consume()
    while not held:
        connection.drain_events(timeout=5)
    with pytest.raises(socket.timeout):  # waiting for the next: BRPOP stays in flight
        while True:
            connection.drain_events(timeout=0.2)
    channel = connection.default_channel
    assert len(held) == 1 and channel._in_poll and len(channel.qos._delivered) == 1
    return connection


def redis_killed(private_redis) -> None:
    os.kill(private_redis.process.pid, signal.SIGKILL)
    private_redis.process.wait(10)


def test_a_channel_waiting_in_brpop_when_redis_dies_closes_with_its_connection(
        private_redis):
    connection = connection_shaped_as_a_workers(private_redis.url, OURS)
    channel = connection.default_channel
    redis_killed(private_redis)

    connection.collect()
    connection.close()  # what raised, stopping the worker for good

    assert channel.closed
    assert channel.qos._delivered.restored  # its unacknowledged task: restore tried


def test_kombus_own_transport_still_fails_there(private_redis):
    """When this fails, kombu closes such a channel itself: project/broker.py and
    CELERY_BROKER_TRANSPORT can go."""
    connection = connection_shaped_as_a_workers(private_redis.url, STOCK)
    redis_killed(private_redis)

    connection.collect()
    with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'hostname'"):
        connection.close()
