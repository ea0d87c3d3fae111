"""channels_redis's layer with its blocking pop's wait as a setting.

Its consumers wait for messages in blocking pops of a fixed 5 s, so the socket's
read timeout had to be longer than that; here the pop waits `blocking_pop_s`
(settings: half of REDIS_TIMEOUT_S), so every Redis read can time out within a few
seconds and an idle websocket still stays open (django/channels_redis#422).

A consumer that ends (its socket closed or refused) cancels its pending receive;
redis-py swallows a cancellation that arrives during a blocking pop
(redis/redis-py#2028), and channels_redis then pops again, for ever: the consumer
never ended and kept a Redis connection popping. Here a pop that returns while its
task is being cancelled raises the cancellation: the consumer ends within
`blocking_pop_s`, and a message that pop took stays in channels_redis's backup
queue, put back by the next receive on the channel.
"""

import asyncio

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


class RedisChannelLayer(_RedisChannelLayer):
    def __init__(self, *args, blocking_pop_s: float = 5, **kwargs):
        super().__init__(*args, **kwargs)
        self.brpop_timeout = blocking_pop_s

    async def _brpop_with_clean(self, index, channel, timeout):
        member = await super()._brpop_with_clean(index, channel, timeout)
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise asyncio.CancelledError
        return member
