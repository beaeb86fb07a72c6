"""jobs-redis: the Redis driver for ``jobs``.

``RedisDriver.connect("redis://127.0.0.1:6379/0", prefix="jobs", done_ttl="7d")``, or
``jobs_core.open_driver("redis://…")`` through the ``redis``/``rediss`` entry points
(``redis+cluster://``/``rediss+cluster://`` for a Redis Cluster).
"""

from jobs_redis._connection import is_cluster_url, open_client
from jobs_redis._driver import (
    CARRIED,
    RedisDriver,
    RedisEventBus,
    RedisLeaseStore,
    RedisStepStore,
    RedisWakeSource,
    open_redis_driver,
)
from jobs_redis._introspect import RedisIntrospector

__version__ = "0.1.0"

__all__ = [
    "CARRIED",
    "RedisDriver",
    "RedisEventBus",
    "RedisIntrospector",
    "RedisLeaseStore",
    "RedisStepStore",
    "RedisWakeSource",
    "is_cluster_url",
    "open_client",
    "open_redis_driver",
]
