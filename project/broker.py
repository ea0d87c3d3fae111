"""The broker's transport: kombu's Redis transport, whose channels close even when
Redis died under them (named by CELERY_BROKER_TRANSPORT; docs/operations.md).

Closing a channel whose BRPOP is in flight, kombu first reads that command's reply,
so that a message Redis popped for it is not lost (celery/kombu#1733). When Redis
died, the read raises a connection error and kombu abandons the close there. A
Celery worker that loses its broker closes its connection's channels (kombu's pass
over them stops at the first that fails: one on a broadcast queue, as the worker's
control channel is, cannot unbind it from a dead Redis), detaches the transport
(`Connection.collect`) and closes the connection again. Only then does the channel
left open close, and restore its unacknowledged messages (a task running in the
pool, a countdown waiting) through a new pool whose parameters it reads from the
detached transport: `AttributeError: 'NoneType' object has no attribute
'hostname'`, neither a connection nor a channel error, so the worker stops
("Unrecoverable error") for good. That is whenever Redis dies while a worker holds
a message and waits for the next one (a pool process free, or a countdown held).

Here a dead connection's reply is taken for what it is, none: the channel closes at
once, its transport still attached; its messages are put back if Redis still
answers, else they are gone with it (beat's sweeps queue their work again from the
database), and the worker reconnects.
"""

from queue import Empty

from kombu.transport import redis


class Channel(redis.Channel):
    def close(self):
        if self._in_poll:
            try:
                self._brpop_read()
            except (Empty, *self.connection_errors):
                pass  # nothing was popped, or the connection died with its reply
        super().close()


class Transport(redis.Transport):
    Channel = Channel
