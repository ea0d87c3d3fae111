"""channels_redis's layer with its blocking pop's wait as a setting.

Its consumers wait for messages in blocking pops of a fixed 5 s, so the socket's
read timeout had to be longer than that; here the pop waits `blocking_pop_s`
(settings: half of REDIS_TIMEOUT_S), so every Redis read can time out within a few
seconds and an idle websocket still stays open (django/channels_redis#422).
"""

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer


class RedisChannelLayer(_RedisChannelLayer):
    def __init__(self, *args, blocking_pop_s: float = 5, **kwargs):
        super().__init__(*args, **kwargs)
        self.brpop_timeout = blocking_pop_s
